"""Site profiles from mldist-sites.toml (``mldist.launch.batch.sites``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldist.errors import ConfigError
from mldist.launch.batch.sites import load_sites, site_profile


def test_site_files_override_and_are_checked(tmp_path: Path) -> None:
    (tmp_path / "mldist-sites.toml").write_text(
        '[sites.polaris]\nscheduler = "pbs"\nqueue = "prod"\n[sites.mine]\nscheduler = "slurm"\n'
    )
    sites = load_sites({"HOME": str(tmp_path / "nohome")}, tmp_path)
    assert sites["polaris"]["queue"] == "prod" and sites["mine"]["scheduler"] == "slurm"
    (tmp_path / "mldist-sites.toml").write_text('[sites.bad]\nqueu = "x"\n')
    with pytest.raises(ConfigError, match="unknown option 'queu'"):
        load_sites({"HOME": str(tmp_path)}, tmp_path)
    with pytest.raises(ConfigError, match=r"known sites: .*polaris"):
        site_profile("nowhere", {"HOME": str(tmp_path / "nohome")}, tmp_path / "empty")
