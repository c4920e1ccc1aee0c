"""Site profiles from mldist-sites.toml (``mldist.launch.batch.sites``): files, ``extends``, ``partitions``, types."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mldist.cli import build_parser
from mldist.cli.common import command_after_dashes
from mldist.errors import ConfigError
from mldist.launch.batch.build import build_spec
from mldist.launch.batch.launchers import launcher_name
from mldist.launch.batch.render import render
from mldist.launch.batch.sites import BUILTIN, load_sites, site_profile
from mldist.launch.batch.spec import JobSpec


def sites_in(tmp_path: Path, text: str) -> dict[str, dict[str, Any]]:
    """All profiles with ``text`` as the project file (./mldist-sites.toml) and no user file."""
    (tmp_path / "mldist-sites.toml").write_text(text)
    sites: dict[str, dict[str, Any]] = load_sites({"HOME": str(tmp_path / "nohome")}, tmp_path)
    return sites


def test_site_files_override_and_are_checked(tmp_path: Path) -> None:
    (tmp_path / "mldist-sites.toml").write_text(
        '[sites.polaris]\nscheduler = "pbs"\nqueue = "prod"\n[sites.mine]\nscheduler = "slurm"\n'
    )
    sites = load_sites({"HOME": str(tmp_path / "nohome")}, tmp_path)
    assert sites["polaris"]["queue"] == "prod" and sites["mine"]["scheduler"] == "slurm"
    assert "launcher" not in sites["polaris"]  # a profile of the same name replaces the built-in one
    (tmp_path / "mldist-sites.toml").write_text('[sites.bad]\nqueu = "x"\n')
    with pytest.raises(ConfigError, match="unknown option 'queu'"):
        load_sites({"HOME": str(tmp_path)}, tmp_path)
    with pytest.raises(ConfigError, match=r"known sites: .*polaris"):
        site_profile("nowhere", {"HOME": str(tmp_path / "nohome")}, tmp_path / "empty")


# extends


def test_extends_merges_env_and_partitions_and_replaces_the_rest(tmp_path: Path) -> None:
    sites = sites_in(
        tmp_path,
        '[sites.mysaga]\nextends = "saga"\nmem_per_cpu = "4G"\nmodules = ["TensorFlow/2.15"]\n'
        '[sites.mysaga.env]\nNCCL_DEBUG = "INFO"\nOMPI_MCA_pml = "ucx"\n'
        '[sites.mysaga.partitions]\ngpu = "a100"\n',
    )
    mine = sites["mysaga"]
    assert "extends" not in mine
    assert mine["env"] == {"OMPI_MCA_btl": "^openib", "OMPI_MCA_pml": "ucx", "NCCL_DEBUG": "INFO"}
    assert mine["partitions"] == {"cpu": "normal", "gpu": "a100"}
    assert mine["mem_per_cpu"] == "4G" and mine["modules"] == ["TensorFlow/2.15"]
    assert mine["gpu_request"] == "task" and mine["module_purge"] is True  # inherited
    assert sites["saga"] == {**BUILTIN["saga"]}  # the base is untouched


def test_extends_chains(tmp_path: Path) -> None:
    sites = sites_in(
        tmp_path,
        '[sites.lab]\nextends = "polaris"\naccount = "LAB"\n[sites.lab.env]\nNCCL_DEBUG = "WARN"\n'
        '[sites.me]\nextends = "lab"\nqueue = "debug"\n[sites.me.env]\nNCCL_DEBUG = "INFO"\n',
    )
    me = sites["me"]
    assert (me["scheduler"], me["launcher"], me["account"], me["queue"]) == ("pbs", "pals", "LAB", "debug")
    assert me["env"]["NCCL_DEBUG"] == "INFO" and me["env"]["NCCL_NET"] == "AWS Libfabric"
    assert sites["lab"]["env"]["NCCL_DEBUG"] == "WARN" and "queue" not in sites["lab"]


@pytest.mark.parametrize(
    ("text", "chain"),
    [
        ('[sites.a]\nextends = "b"\n[sites.b]\nextends = "a"\n', "a -> b -> a"),
        ('[sites.a]\nextends = "b"\n[sites.b]\nextends = "c"\n[sites.c]\nextends = "b"\n', "a -> b -> c -> b"),
        ('[sites.a]\nextends = "a"\n', "a -> a"),
    ],
    ids=["two", "three", "self"],
)
def test_an_extends_loop_is_one_error_naming_the_chain(tmp_path: Path, text: str, chain: str) -> None:
    with pytest.raises(ConfigError, match="extends forms a loop") as err:
        sites_in(tmp_path, text)
    assert f"({chain})" in str(err.value)


def test_extending_an_unknown_profile_names_it_and_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"site 'a' extends 'polars', which is not defined; known: .*polaris"):
        sites_in(tmp_path, '[sites.a]\nextends = "polars"\n')


def test_a_user_profile_extends_polaris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    (config / "mldist").mkdir(parents=True)
    (config / "mldist" / "sites.toml").write_text(
        '[sites.mypolaris]\nextends = "polaris"\nqueue = "debug"\naccount = "MYPROJ"\n'
        'modules = ["conda/2024-04-29"]\nunset = ["http_proxy", "https_proxy"]\n'
        '[sites.mypolaris.env]\nNCCL_DEBUG = "INFO"\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    profile = site_profile("mypolaris", {"XDG_CONFIG_HOME": str(config), "HOME": "/nonexistent"}, work)
    assert profile["launcher"] == "pals" and profile["cores_per_node"] == 32 and profile["queue"] == "debug"
    # Through `mldist submit --site mypolaris` (the CLI reads XDG_CONFIG_HOME and the working directory).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.chdir(work)
    script = render(spec("--site", "mypolaris", "--nodes", "2"))
    lines = script.splitlines()
    assert "#PBS -q debug" in lines and "#PBS -A MYPROJ" in lines and "#PBS -l filesystems=home:eagle" in lines
    assert "module load conda/2024-04-29" in lines and "module purge" not in lines
    assert "unset http_proxy https_proxy" in lines
    assert "export NCCL_DEBUG=INFO" in lines and "export NCCL_NET_GDR_LEVEL=PHB" in lines
    assert "mpiexec -n 8 --ppn 4 --depth 16 --cpu-bind depth bash -c " in script


def test_a_project_profile_extends_a_user_profile(tmp_path: Path) -> None:
    config = tmp_path / "config"
    (config / "mldist").mkdir(parents=True)
    (config / "mldist" / "sites.toml").write_text('[sites.base]\nscheduler = "slurm"\ncores_per_node = 48\n')
    (tmp_path / "mldist-sites.toml").write_text('[sites.proj]\nextends = "base"\ntasks_per_node = 4\n')
    proj = site_profile("proj", {"XDG_CONFIG_HOME": str(config)}, tmp_path)
    assert (proj["scheduler"], proj["cores_per_node"], proj["tasks_per_node"]) == ("slurm", 48, 4)


# partitions


def spec(*words: str) -> JobSpec:
    """The JobSpec of ``mldist submit WORDS -- python train.py`` (nothing submitted)."""
    parser, _ = build_parser()
    args = parser.parse_args(["submit", *words, "--output-dir", "/scratch/u/run", "--", "python", "train.py"])
    return build_spec(vars(args), command_after_dashes(args.cmd, "python train.py"), now=0.0)


@pytest.fixture
def project_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a project site file, and no user site file."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mldist-sites.toml").write_text(
        '[sites.hpc]\nscheduler = "slurm"\ncores_per_node = 40\n'
        '[sites.hpc.partitions]\ncpu = "normal"\ngpu = "accel"\n'
        '[sites.gpuonly]\nextends = "hpc"\ngpus_per_node = 4\n'
    )
    return tmp_path


@pytest.mark.usefixtures("project_sites")
def test_partitions_follow_the_kind_of_job_and_partition_wins() -> None:
    assert spec("--site", "hpc").queue == "normal"
    assert spec("--site", "hpc", "--gpus-per-node", "2").queue == "accel"
    assert spec("--site", "gpuonly").queue == "accel"  # GPUs from the profile count too
    assert spec("--site", "gpuonly", "--gpus-per-node", "0").queue == "normal"
    assert spec("--site", "hpc", "--gpus-per-node", "2", "--partition", "a100").queue == "a100"
    assert spec("--site", "hpc", "--queue", "bigmem").queue == "bigmem"
    assert "#SBATCH --partition=accel" in render(spec("--site", "hpc", "--gpus-per-node", "2")).splitlines()


@pytest.mark.usefixtures("no_user_sites")
def test_saga_partitions_from_the_built_in_profile() -> None:
    assert spec("--site", "saga").queue == "normal"
    assert spec("--site", "saga", "--gpus-per-node", "4").queue == "accel"


@pytest.fixture
def no_user_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)


# the types of the new options


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('cores_per_node = "64"', "cores_per_node must be a whole number"),
        ("cores_per_node = 64.0", "cores_per_node must be a whole number"),
        ("hyperthreads = true", "hyperthreads must be a whole number"),
        ("tasks_per_node = -1", "tasks_per_node must be a whole number from 0 to 100000"),
        ('module_purge = "yes"', "module_purge must be true or false"),
        ("module_purge = 1", "module_purge must be true or false"),
        ('wrap = "nsys profile --"', "wrap must be a list of strings"),
        ("wrap = [1, 2]", "wrap must be a list of strings"),
        ('env_source = "/opt/vars.sh"', "env_source must be a list of strings"),
        ('container_args = "--nv"', "container_args must be a list of strings"),
        ("launcher = 3", "launcher must be a string"),
        ("mem_per_cpu = 4", "mem_per_cpu must be a string"),
        ("gpu_request = true", "gpu_request must be a string"),
        ("extends = 3", "extends must be a string"),
        ('partitions = "accel"', "partitions must be a table like"),
        ('partitions = {big = "x"}', "partitions must be a table like"),
        ("partitions = {gpu = 1}", "partitions must be a table like"),
        ("env = {A = 1}", "env must be a table of strings"),
        ('mldist_path = "/x"', "unknown option 'mldist_path'"),
    ],
)
def test_profile_options_are_type_checked(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"site 'x' in .*mldist-sites.toml: ") as err:
        sites_in(tmp_path, f'[sites.x]\nscheduler = "slurm"\n{line}\n')
    assert message in str(err.value)


def test_well_typed_new_options_load_and_reach_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vars_sh = tmp_path / "vars.sh"
    vars_sh.write_text("export VTUNE=1\n")
    sites_in(
        tmp_path,
        '[sites.x]\nscheduler = "pbs"\nlauncher = "hydra"\ncores_per_node = 64\nhyperthreads = 2\n'
        f'module_purge = true\nwrap = ["perf", "record", "-o", "{{job_dir}}/perf-{{rank}}", "--"]\n'
        f'env_source = ["{vars_sh}"]\ncontainer_args = ["--rocm"]\n',
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    s = spec("--site", "x", "--nodes", "2", "--tasks-per-node", "4")
    assert (launcher_name(s), s.threads, s.module_purge, s.env_source) == ("hydra", 32, True, (str(vars_sh),))
    assert s.wrap == ("perf", "record", "-o", "{job_dir}/perf-{rank}", "--")
    assert spec("--site", "x", "--no-module-purge").module_purge is False
    assert spec("--site", "x", "--wrap", "nsys profile --").wrap == ("nsys", "profile", "--")  # replaces


def test_every_built_in_profile_is_well_typed_and_renders(no_user_sites: None) -> None:
    for name in BUILTIN:
        profile = site_profile(name)
        assert profile["scheduler"] in ("slurm", "pbs", "cobalt"), name
        assert render(spec("--site", name, "--nodes", "2", "--time", "1:00:00")).startswith("#!/bin/bash\n"), name
