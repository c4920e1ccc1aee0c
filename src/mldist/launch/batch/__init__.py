"""Batch jobs: a validated ``JobSpec`` (spec), one record per scheduler
(schedulers), the script (render), site profiles (sites) and the side effects
of submitting and following jobs (records)."""
