"""Batch jobs, bottom to top: a validated ``JobSpec`` (spec, with the shell-word parser
expand), one record per scheduler (schedulers) and per launcher (launchers), the checks
that need those tables (checks), the spec of ``mldist submit``'s options over a site
profile (build, sites), the script (render, software), the build-env job (buildenv,
wheelhouse), container images (images), and the side effects of submitting and
following jobs (records, joblogs)."""
