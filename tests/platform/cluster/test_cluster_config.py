"""cluster.yaml validates against the JSON schema Ray ships, and keeps the security defaults."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from methods.recipe import NAMED
from tests.helpers import ROOT
from tests.services import throwaway_head


def _config():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_validates_against_rays_schema():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(_config(), schema)


def test_cluster_layout_and_security_defaults():
    cfg = _config()
    nodes = cfg["available_node_types"]
    assert cfg["head_node_type"] == "head" and nodes["gpu_worker"]["min_workers"] == 0
    # No group for Ray's bootstrap to make (it would open SSH to 0.0.0.0/0): every node type names
    # the platform's group and its own instance profile, placeholders AWS refuses unrendered.
    assert "security_group" not in cfg["provider"]
    assert {k: n["node_config"]["SecurityGroupIds"] for k, n in nodes.items()} == {
        "head": ["${SECURITY_GROUP_ID}"], "gpu_worker": ["${SECURITY_GROUP_ID}"], "cpu_worker": ["${SECURITY_GROUP_ID}"]}
    assert nodes["head"]["node_config"]["IamInstanceProfile"] == {"Arn": "${HEAD_INSTANCE_PROFILE_ARN}"}
    assert nodes["gpu_worker"]["node_config"]["IamInstanceProfile"] == {"Arn": "${WORKER_INSTANCE_PROFILE_ARN}"}
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "mlflow server" in head and "MLFLOW_TRACKING_URI" in head
    # torch's builds, locked: CUDA on the workers, CPU on the head (was: unlocked cu128/cpu installs).
    assert "requirements/cuda.txt" in " ".join(cfg["worker_setup_commands"])
    assert "requirements/cpu.txt" in " ".join(cfg["head_setup_commands"])
    text = (ROOT / "cluster.yaml").read_text().lower()
    assert "aws_secret_access_key" not in text and not re.search(r"password(\s*=|:\s)\s*\S", text)  # no value set here


def test_ray_runs_with_a_token_made_on_the_head_and_given_to_the_workers():
    """Ray 2.60 authenticates only where RAY_AUTH_MODE=token: every node starts Ray so, with the
    token the head makes once (owner-only) and the launcher copies to the workers."""
    cfg = _config()
    made = " ".join(cfg["head_setup_commands"])
    assert "~/.ray/auth_token" in made and "umask 077" in made and "secrets.token_hex(32)" in made
    assert cfg["cluster_synced_files"] == ["~/.ray/auth_token"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert start.index("RAY_AUTH_MODE=token") < start.index("ray start --")
    assert "export RAY_AUTH_MODE=token" in " ".join(cfg["setup_commands"])  # ray exec, job drivers


def test_mlflow_runs_with_basic_auth_from_cluster_env(tmp_path):
    """The head writes MLflow's auth configuration from cluster.env's account (refusing to start
    without one) and serves with --app-name basic-auth; the configuration is owner-only."""
    from platform.cluster import write_mlflow_auth

    head = " ".join(_config()["head_start_ray_commands"])
    assert "--app-name basic-auth" in head and "MLFLOW_AUTH_CONFIG_PATH=~/mlflow/basic_auth.ini" in head
    assert "platform.cluster mlflow-auth ~/mlflow/basic_auth.ini" in head
    assert ': "${MLFLOW_TRACKING_PASSWORD:?' in head and "MLFLOW_FLASK_SERVER_SECRET_KEY" in head
    path = write_mlflow_auth(tmp_path / "auth" / "basic_auth.ini", "platform", "a-long-password-1")
    text = path.read_text()
    assert "admin_username = platform" in text and "admin_password = a-long-password-1" in text
    assert "default_permission = NO_PERMISSIONS" in text and oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_mlflow_server_remembers_a_checked_password(tmp_path, monkeypatch):
    """MLflow's own reader of the file finds the credential cache on (off by default: every request
    would re-derive the password hash, ~0.4 CPU-s each; benchmark case mlflow-auth)."""
    from mlflow.server.auth.config import read_auth_config

    from platform.cluster import AUTH_CACHE_TTL_S, write_mlflow_auth

    path = write_mlflow_auth(tmp_path / "basic_auth.ini", "platform", "a-long-password-1")
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    config = read_auth_config()
    assert config.auth_cache_ttl_seconds == AUTH_CACHE_TTL_S > 0
    assert config.admin_username == "platform"


def _env_file(tmp_path, **values):
    settings = {"CLUSTER_NAME": "platform-test", "SSH_ALLOWED_CIDR": "81.2.69.0/24", "MLFLOW_TRACKING_USERNAME": "platform",
                "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery", "MLFLOW_ARTIFACTS_DESTINATION": "s3://b/mlflow",
                "RUNS_URI": "s3://b/runs", **values}
    path = tmp_path / "cluster.env"
    path.write_text("# settings\n" + "".join(f"{k}={v}  # note\n" for k, v in settings.items() if v is not None))
    return path


def test_render_puts_the_platforms_group_and_profiles_in_and_validates(tmp_path):
    """What ``up`` hands ``ray up``: the placeholders replaced by what ``provision`` made, the
    repository's absolute path as the synced folder, valid for Ray's schema."""
    from platform.cluster import render
    from platform.cluster_aws import Access

    access = Access("sg-0123456789abcdef0", "arn:aws:iam::123456789012:instance-profile/h",
                    "arn:aws:iam::123456789012:instance-profile/w")
    out = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml", access)
    rendered = yaml.safe_load(out.read_text())
    nodes = rendered["available_node_types"]
    assert nodes["head"]["node_config"]["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
    assert nodes["gpu_worker"]["node_config"]["IamInstanceProfile"] == {"Arn": access.worker_profile_arn}
    assert "${" not in yaml.safe_dump(nodes) and rendered["file_mounts"] == {"~/platform": str(ROOT)}
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(rendered, schema)


@pytest.mark.parametrize("values,needle", [
    ({"SSH_ALLOWED_CIDR": "0.0.0.0/0"}, "opens SSH to the whole internet"),
    ({"SSH_ALLOWED_CIDR": "::/0"}, "opens SSH to the whole internet"),
    ({"SSH_ALLOWED_CIDR": "my office"}, "is not an address range"),
    ({"SSH_ALLOWED_CIDR": "198.51.100.0/24"}, "is a documentation range"),
    ({"SSH_ALLOWED_CIDR": None}, "set SSH_ALLOWED_CIDR"),
    ({"MLFLOW_TRACKING_PASSWORD": "short"}, "at least 12 characters"),
    ({"MLFLOW_TRACKING_PASSWORD": None}, "set MLFLOW_TRACKING_PASSWORD"),
    ({"MLFLOW_ARTIFACTS_DESTINATION": "/home/me"}, "must be an s3:// location"),
    ({"RUNS_URI": None}, "set RUNS_URI"),
    ({"RUNS_URI": "gs://b/runs"}, "RUNS_URI must be an s3:// location"),
    ({"MLFLOW_DB_BACKUP": "/home/me/mlflow.db"}, "MLFLOW_DB_BACKUP must be an s3:// location"),
    ({"CLUSTER_NAME": None}, "set CLUSTER_NAME"),
    ({"CLUSTER_NAME": "Alice's cluster"}, "must be 1-40 lowercase letters"),
    ({"CLUSTER_NAME": "alice-"}, "not ending with a hyphen"),  # RDS refuses it, after the group and the password
    ({"CLUSTER_NAME": "a--b"}, "single hyphens"),
    ({"CLUSTER_NAME": "a" * 41}, "must be 1-40"),
    ({"EBS_KMS_KEY_ARN": "alias/aws/ebs"}, "EBS_KMS_KEY_ARN='alias/aws/ebs' must be a KMS key's ARN"),
])
def test_cluster_env_mistakes_are_one_line(values, needle, tmp_path, cli):
    proc = cli("cluster", "render", "--env-file", str(_env_file(tmp_path, **values)))
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert "correct-horse" not in proc.stderr


def test_the_whole_internet_only_when_said(tmp_path):
    from platform.cluster import read_settings
    from platform.cluster_aws import open_to_internet, wanted_ingress

    values = read_settings(_env_file(tmp_path, SSH_ALLOWED_CIDR="0.0.0.0/0", SSH_ALLOW_ANYWHERE="yes"))
    assert open_to_internet(wanted_ingress("sg-1", values["SSH_ALLOWED_CIDR"])) == ["tcp 22-22 from 0.0.0.0/0"]
    assert open_to_internet(wanted_ingress("sg-1", "198.51.100.0/24")) == []


def test_cluster_sized_to_the_paper_sweeps_and_head_runs_no_training():
    """The GPU nodes the cluster can scale to are what the paper profile's concurrent trials use
    (each trial num_workers GPUs, one GPU per node); the head offers Ray no CPUs or GPUs, so no
    Train worker or Ray Data task lands there."""
    from platform.config import TrainConfig
    from platform.space import load_space

    cfg = _config()
    gpu_nodes = cfg["available_node_types"]["gpu_worker"]["max_workers"]
    assert cfg["max_workers"] == gpu_nodes + cfg["available_node_types"]["cpu_worker"]["max_workers"]
    for method in NAMED:  # every named recipe's paper sweep fills the cluster's GPU nodes
        base = TrainConfig.build(method, "paper")
        spec = load_space(base, None)
        assert spec.max_concurrent_trials * base.num_workers == gpu_nodes, method
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--num-cpus=0" in head


def test_fresh_ubuntu_gets_a_venv_that_jobs_use():
    """Ubuntu 22.04 cloud images lack python3-venv (and their python3 is 3.10): every node installs
    it for uv's bootstrap, makes ~/venv with the stated Python through uv, and puts it first on PATH
    for the Ray processes that start jobs (whose entrypoint says `python`)."""
    cfg = _config()
    setup = " ".join(cfg["setup_commands"])
    assert "apt_get install -y python3-venv" in setup and "uv venv --seed --clear --python 3.11" in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert start.index('export PATH="$HOME/venv/bin:$PATH"') < start.index("ray start")


def test_aws_that_does_not_answer_is_one_line(tmp_path, cli):
    """``up``/``render`` make AWS resources with the user's credentials: a refusal or an endpoint
    that does not answer is one line, and nothing is rendered."""
    config = tmp_path / "cluster.yaml"
    config.write_text((ROOT / "cluster.yaml").read_text())
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path)), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "AWS refused making the cluster's security group and instance profiles" in proc.stderr
    assert not (tmp_path / ".cluster").exists() and "correct-horse" not in proc.stderr


def test_the_policy_judge_follows_awss_rules():
    """tests/aws_policy.py, which judges the roles against recorded requests: a condition on a key
    the request lacks does not hold (unless ...IfExists); Deny wins; no Allow is a deny; the S3
    operations map to the actions AWS documents (HeadBucket is s3:ListBucket)."""
    from tests.aws_policy import Request, allowed, s3_requests

    head_bucket = Request("HeadBucket", "s3:ListBucket", "arn:aws:s3:::b")
    listing = Request("ListObjectsV2", "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "runs/x/"})
    elsewhere = Request("ListObjectsV2", "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "home/"})
    plain = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
             "Condition": {"StringLike": {"s3:prefix": ["runs", "runs/*"]}}}
    if_exists = {**plain, "Condition": {"StringLikeIfExists": {"s3:prefix": ["runs", "runs/*"]}}}
    assert not allowed([plain], head_bucket) and allowed([plain], listing) and not allowed([plain], elsewhere)
    assert allowed([if_exists], head_bucket) and allowed([if_exists], listing) and not allowed([if_exists], elsewhere)
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    assert not allowed([if_exists, deny], listing) and not allowed([], listing)
    assert allowed([{"Effect": "Allow", "Action": "S3:Get*", "Resource": "arn:aws:s3:::b/runs/*"}],
                   Request("GetObject", "s3:GetObject", "arn:aws:s3:::b/runs/a/b"))
    entry = lambda method, url, **h: {"method": method, "url": url, "headers": h}  # noqa: E731
    assert [r.action for r in s3_requests(entry("HEAD", "http://h/b"))] == ["s3:ListBucket"]
    assert s3_requests(entry("GET", "http://h/b?list-type=2&prefix=runs%2F&delimiter=%2F"))[0].context == {
        "s3:prefix": "runs/", "s3:delimiter": "/"}
    assert [(r.action, r.resource) for r in s3_requests(entry("PUT", "http://h/b/k2", **{"x-amz-copy-source": "/b/k1"}))] == [
        ("s3:PutObject", "arn:aws:s3:::b/k2"), ("s3:GetObject", "arn:aws:s3:::b/k1")]
    assert s3_requests(entry("DELETE", "http://h/b/k?uploadId=1"))[0].action == "s3:AbortMultipartUpload"


def test_the_cluster_is_named_by_cluster_env_and_tags_what_it_launches(tmp_path):
    """cluster.yaml names no cluster (a fixed name made a second user's up take over the first
    one's head and rules): render puts in CLUSTER_NAME, and every instance and volume Ray's
    launcher makes carries the cost-allocation tag."""
    from platform.cluster import render
    from platform.cluster_aws import COST_TAG, Access

    assert _config()["cluster_name"] == "${CLUSTER_NAME}"
    access = Access("sg-0123456789abcdef0", "arn:aws:iam::1:instance-profile/h", "arn:aws:iam::1:instance-profile/w")
    out = render(ROOT / "cluster.yaml", _env_file(tmp_path, CLUSTER_NAME="platform-alice"), tmp_path / "r.yaml", access)
    rendered = yaml.safe_load(out.read_text())
    assert rendered["cluster_name"] == "platform-alice"
    for node in rendered["available_node_types"].values():
        specs = node["node_config"]["TagSpecifications"]
        assert {s["ResourceType"] for s in specs} == {"instance", "volume"}
        assert all(s["Tags"] == [{"Key": COST_TAG, "Value": "platform-alice"}] for s in specs)


WANTED = ("PLATFORM_DATA_DIR", "PLATFORM_CACHE_DIR", "PLATFORM_OUTPUT_DIR", "PLATFORM_GIT_COMMIT", "PLATFORM_CLUSTER",
          "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "RAY_AUTH_MODE", "PATH")


def _seen(argv: list[str], env: dict, home: Path) -> dict:
    """What a shell started as ``argv`` (its last word's ``{}`` the commands to run) sees of ``WANTED``."""
    script = "; ".join(f'echo "{k}=${k}"' for k in WANTED)
    proc = subprocess.run([*argv[:-1], argv[-1].replace("{}", script)], cwd=home, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and line.split("=")[0] in WANTED)


def test_every_way_into_the_head_sees_one_environment(tmp_path):
    """``ray attach`` (an interactive login shell, also under ``--tmux``), ``ray exec`` (Ray's own
    command wrapper) and the processes the head's start command launches (MLflow, ``ray start``,
    so every ``ray job submit`` driver) see the data folder, the MLflow server and account,
    RUNS_URI as output_dir's default, the cache folder, the commit ``up`` recorded, Ray's token
    mode and the venv first on PATH. (Before: only PATH and RAY_AUTH_MODE reached a shell.)"""
    from ray.autoscaler._private.command_runner import _with_interactive

    from platform.cluster import render
    from platform.cluster_aws import Access

    access = Access("sg-0123456789abcdef0", "arn:aws:iam::1:instance-profile/h", "arn:aws:iam::1:instance-profile/w")
    out = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml", access)
    home, env = throwaway_head(tmp_path, yaml.safe_load(out.read_text()))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    ip = subprocess.run(["bash", "-c", "hostname -I | awk '{print $1}'"], capture_output=True, text=True).stdout.strip()
    wanted = {"PLATFORM_DATA_DIR": f"{home}/data", "PLATFORM_CACHE_DIR": f"{home}/platform-cache",
              "PLATFORM_OUTPUT_DIR": "s3://b/runs", "PLATFORM_GIT_COMMIT": commit, "PLATFORM_CLUSTER": "platform-test",
              "MLFLOW_TRACKING_URI": f"http://{ip}:5000", "MLFLOW_TRACKING_USERNAME": "platform",
              "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery", "RAY_AUTH_MODE": "token"}
    start = next(c for c in yaml.safe_load(out.read_text())["head_start_ray_commands"] if "ray start --head" in c)
    ways = {
        "ray attach (bash -lic)": ["bash", "-lic", "{}"],
        "ray exec": ["bash", "-c", "exec " + " ".join(_with_interactive("{}"))],
        "ray start and its jobs": ["bash", "-c", start.split("HEAD_IP=")[0] + "{}"],
    }
    for way, argv in ways.items():
        seen = _seen(argv, env, home)
        assert {k: seen.get(k) for k in wanted} == wanted, way
        assert seen["PATH"].split(":")[0] == f"{home}/venv/bin", (way, seen["PATH"])
    assert oct((home / f"platform-env-{socket.gethostname()}.sh").stat().st_mode & 0o777) == "0o600"  # it holds the MLflow password
    # What a sweep started there would use: output_dir from RUNS_URI, named as such.
    proc = subprocess.run(["bash", "-lic", f"cd {ROOT} && python -m platform.train una --print-config"], cwd=home,
                          env=env, capture_output=True, text=True, timeout=120)
    assert 'output_dir: "s3://b/runs"  # environment PLATFORM_OUTPUT_DIR' in proc.stdout, proc.stderr[-2000:]


def test_the_processes_ray_starts_on_a_node_get_threads_by_their_cpus(tmp_path):
    """Ray's launcher runs every start command as ``source ~/.bashrc; export OMP_NUM_THREADS=1 &&
    (...)`` (``_with_interactive``, the updater's variables before it): a raylet started so gives
    each task, actor and Train worker one OpenMP thread, whatever CPUs it holds (a 2-CPU task on a
    ``ray start`` made with the variable: 1 thread; without it: 2). The head's
    and a worker's ``ray start``, run as the launcher runs them in a throwaway HOME, see it unset,
    so Ray sets each process's threads by its CPUs (``tests/platform/test_shim.py`` checks that on a local
    instance); a value cluster.env gives is kept."""
    from ray._private.ray_constants import RESOURCES_ENVIRONMENT_VARIABLE
    from ray.autoscaler._private.command_runner import _with_environment_variables, _with_interactive

    from platform.cluster import node_env, render
    from platform.cluster_aws import Access

    access = Access("sg-0123456789abcdef0", "arn:aws:iam::1:instance-profile/h", "arn:aws:iam::1:instance-profile/w")
    rendered = yaml.safe_load(render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "r.yaml", access).read_text())
    home, env = throwaway_head(tmp_path, rendered)
    probe = 'echo "OMP=${OMP_NUM_THREADS-unset}"'

    def as_the_launcher_runs(command: str) -> str:
        wrapped = _with_interactive(_with_environment_variables(command, {RESOURCES_ENVIRONMENT_VARIABLE: {"CPU": 2}}))
        # ssh hands the words to the node's shell as one command line, as `ray exec` above.
        proc = subprocess.run(["bash", "-c", "exec " + " ".join(wrapped)], cwd=home, env={**env, "RAY_HEAD_IP": "10.0.0.5"},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().rpartition("\n")[2]  # the probe's line, after any of the shell's own

    assert as_the_launcher_runs(probe) == "OMP=1"  # what the launcher gives any command
    head = next(c for c in rendered["head_start_ray_commands"] if "ray start --head" in c)
    assert as_the_launcher_runs(head.split("HEAD_IP=")[0] + probe) == "OMP=unset"  # before MLflow's start
    worker = rendered["worker_start_ray_commands"]
    for command in [c for c in worker if "node-env" in c]:  # this HOME's node environment, now a worker's
        as_the_launcher_runs(command)
    start = next(c for c in worker if "ray start" in c)
    assert as_the_launcher_runs(start.split("~/venv/bin/ray start")[0] + probe) == "OMP=unset"
    values = {"CLUSTER_NAME": "platform-test", "RUNS_URI": "s3://b/runs", "OMP_NUM_THREADS": "4"}
    lines = node_env(values, "worker", "10.0.0.5", home).splitlines()
    assert "export OMP_NUM_THREADS=4" in lines and "unset OMP_NUM_THREADS" not in lines


def test_a_cluster_node_refuses_a_local_mlflow_store(monkeypatch):
    """A shell on a node without the node's environment would write runs to a SQLite file there
    (not the server users browse, not backed up): one line instead."""
    from platform.errors import UserError
    from platform.tracking.store import tracking_uri

    monkeypatch.setenv("PLATFORM_CLUSTER", "platform-test")
    for uri in (None, "sqlite:////home/ubuntu/platform/mlruns/mlflow.db"):
        if uri is None:
            monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(UserError, match="this is a node of cluster platform-test, whose runs go to its MLflow server"):
            tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000")
    assert tracking_uri() == "http://10.0.0.5:5000"
    monkeypatch.delenv("PLATFORM_CLUSTER")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/x.db")
    assert tracking_uri() == "sqlite:////tmp/x.db"


def _rendered(tmp_path, **values) -> dict:
    from platform.cluster import render
    from platform.cluster_aws import Access

    access = Access("sg-0123456789abcdef0", "arn:aws:iam::1:instance-profile/h", "arn:aws:iam::1:instance-profile/w")
    out = render(ROOT / "cluster.yaml", _env_file(tmp_path, **values), tmp_path / "r.yaml", access)
    return yaml.safe_load(out.read_text())


def test_every_worker_type_gets_the_nodes_python_before_its_lock(tmp_path):
    """A node type's own ``worker_setup_commands`` replace the global ``setup_commands`` and
    ``worker_setup_commands`` (Ray's schema): resolved by Ray's autoscaler itself, every worker
    type's commands make uv, the stated Python and ~/venv before the first use of ``~/venv/bin``,
    and install a lock (the CPU worker's used to start with ``~/venv/bin/pip``: no such file)."""
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    rendered = _rendered(tmp_path)
    config = AutoscalingConfig(rendered, skip_content_hash=True)
    for node_type in ("gpu_worker", "cpu_worker"):
        commands = config.get_worker_setup_commands(node_type)
        made = next(i for i, c in enumerate(commands) if "uv venv --seed --clear --python 3.11" in c)
        used = next(i for i, c in enumerate(commands) if "~/venv/bin/pip install" in c)
        assert made < used, node_type
        assert any("requirements/cpu.txt" in c and "requirements/cuda.txt" in c for c in commands[used:]), node_type
    assert all("worker_setup_commands" not in node for node in rendered["available_node_types"].values())


def _worker_home(home: Path, drivers: Path, driver: str) -> tuple[Path, Path]:
    """A worker's HOME whose ``~/venv/bin/pip`` records its arguments in ``pip.log``, and a folder
    with an ``nvidia-smi`` that says ``driver`` (no real GPU here)."""
    bin_dir = home / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pip").write_text(f'#!/bin/sh\necho "$@" >> {home}/pip.log\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    drivers.mkdir()
    (drivers / "nvidia-smi").write_text(f"#!/bin/sh\necho {driver}\n")
    for script in [*bin_dir.iterdir(), drivers / "nvidia-smi"]:
        script.chmod(0o755)
    return home, drivers


def test_the_lock_follows_the_hardware_and_a_driver_that_cannot_run_it_is_one_line(tmp_path):
    """The one worker list installs torch's CPU build where no NVIDIA driver is and its CUDA build
    where one is; a driver too old for the lock's CUDA stops the node's setup with one line that names
    both versions. Run as the launcher runs it, in a HOME whose ``~/venv/bin/pip`` records its
    arguments and whose ``nvidia-smi`` says driver 470.57 (no real GPU here: torch finds no CUDA)."""
    from ray.autoscaler._private.command_runner import _with_interactive

    rendered = _rendered(tmp_path)
    lock = next(c for c in rendered["worker_setup_commands"] if "requirements/cuda.txt" in c)
    home, drivers = _worker_home(tmp_path / "node", tmp_path / "driver-bin", "470.57.02")
    skeleton = Path("/etc/skel/.bashrc").read_text()

    def setup(driver: bool) -> subprocess.CompletedProcess:
        # The login shell's /etc/profile sets PATH anew: the driver's folder comes from the image's ~/.bashrc.
        (home / ".bashrc").write_text((f"export PATH={drivers}:$PATH\n" if driver else "") + skeleton)
        (home / "pip.log").unlink(missing_ok=True)
        return subprocess.run(["bash", "-c", "exec " + " ".join(_with_interactive(lock))], cwd=home, capture_output=True,
                              text=True, timeout=120, env={"HOME": str(home), "PATH": "/usr/bin:/bin", "TERM": "dumb"})

    cpu = setup(driver=False)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    assert "requirements/torch-cpu.txt" in (home / "pip.log").read_text() and "cuda" not in (home / "pip.log").read_text()
    gpu = setup(driver=True)
    assert gpu.returncode != 0 and "requirements/cuda.txt" in (home / "pip.log").read_text()
    import torch

    line = f"this node's NVIDIA driver 470.57.02 does not run the lock's torch {torch.__version__} built for CUDA"
    assert line in gpu.stderr and "Traceback" not in gpu.stderr, gpu.stderr[-2000:]


def test_every_node_requires_imdsv2(tmp_path):
    """Instance metadata only with a session token (IMDSv2) on every node: a request forged through
    a job's HTTP client cannot read the role's credentials."""
    for node in _rendered(tmp_path)["available_node_types"].values():
        assert node["node_config"]["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled"}


@pytest.mark.parametrize("password", ["percent%sign-100%", "%(admin_username)s-long", "has spaces inside it"])
def test_an_mlflow_password_reaches_the_server_as_written(password, tmp_path, monkeypatch):
    """MLflow reads basic_auth.ini with ``configparser.ConfigParser()``, whose interpolation made a
    ``%`` in the password kill the server at start: MLflow's own reader returns it as written."""
    from mlflow.server.auth.config import read_auth_config

    from platform.cluster import write_mlflow_auth

    uri = "postgresql://mlflow:p%40ss@db.internal:5432/mlflow"
    path = write_mlflow_auth(tmp_path / "basic_auth.ini", "admin%user", password, uri)
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    config = read_auth_config()
    assert (config.admin_username, config.admin_password, config.database_uri) == ("admin%user", password, uri)


def test_a_password_the_ini_file_cannot_hold_is_refused_before_anything_is_made(tmp_path, cli):
    env_file = _env_file(tmp_path)
    env_file.write_text(env_file.read_text() + 'MLFLOW_TRACKING_PASSWORD=" correct-horse-battery-staple"\n')
    proc = cli("cluster", "render", "--env-file", str(env_file))
    assert proc.returncode == 2 and "MLFLOW_TRACKING_PASSWORD cannot begin or end with a blank" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / ".cluster").exists()


def test_your_own_machines_run_the_same_commands(tmp_path, cli):
    """``--provider local`` renders Ray's on-premise provider with cluster.yaml's commands, file
    mounts and synced files unchanged (one source for both targets), valid for Ray's schema and
    its on-premise preparation; the nodes' commands learn the provider (no AWS settings asked)."""
    import ray.autoscaler
    from ray.autoscaler._private.local.config import prepare_local
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    from platform.cluster import FIRST_ADDRESS, LOCAL_HEAD_CPUS, SHARED, Hosts, node_settings, render_local

    key = tmp_path / "id_ed25519"
    key.write_text("not read here")
    aws = _rendered(tmp_path)
    env_file = _env_file(tmp_path, SSH_ALLOWED_CIDR=None, MLFLOW_DB="head")
    hosts = Hosts("10.1.0.2", ("10.1.0.3", "10.1.0.4"), "alice", key)
    local = yaml.safe_load(render_local(ROOT / "cluster.yaml", env_file, tmp_path / "l.yaml", hosts).read_text())
    assert local["provider"] == {"type": "local", "head_ip": "10.1.0.2", "worker_ips": ["10.1.0.3", "10.1.0.4"]}
    assert local["auth"] == {"ssh_user": "alice", "ssh_private_key": str(key)}
    for field in SHARED:
        if field.endswith("_commands") and field in aws:
            # after the line that writes what up learnt; the head's own address is the one --head gave
            assert [c.replace("10.1.0.2", FIRST_ADDRESS).replace(LOCAL_HEAD_CPUS, "--num-cpus=0")
                    for c in local[field][1:]] == aws[field][1:], field
        elif field in aws:
            assert local[field] == aws[field], field
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(local, schema)
    prepared, _ = prepare_local(local)
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == 2
    worker = AutoscalingConfig(local, skip_content_hash=True).get_worker_setup_commands("local.cluster.node")
    assert any("uv venv" in c for c in worker) and any("requirements/cpu.txt" in c for c in worker)
    # A node's commands: the provider from what up wrote, so cluster.env needs no SSH range.
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["bash", "-c", local["head_setup_commands"][0]], cwd=home, env={"HOME": str(home)}, check=True)
    assert node_settings(env_file, home)["PLATFORM_CLUSTER_PROVIDER"] == "local"
    proc = cli("cluster", "render", "--provider", "local", "--env-file", str(_env_file(tmp_path, SSH_ALLOWED_CIDR=None)),
               "--head", "10.1.0.2", "--ssh-key", str(key))
    assert proc.returncode == 2 and "MLFLOW_DB=head" in proc.stderr and "Traceback" not in proc.stderr


def test_your_own_head_machine_offers_its_gpus_and_the_cpus_it_can_spare(tmp_path):
    """A lab's head is often a GPU box: on your own machines the head's Ray offers its GPUs (found by
    Ray) and its CPUs but the driver's and MLflow's ``HEAD_RESERVED_CPUS``, none on a small machine.
    The flag as the start command's shell expands it, for a 16-core and a 2-core head (``nproc``
    answering as each would)."""
    from platform.cluster import HEAD_RESERVED_CPUS, Hosts, render_local

    key = tmp_path / "id_ed25519"
    key.write_text("not read here")
    local = yaml.safe_load(render_local(ROOT / "cluster.yaml", _env_file(tmp_path, SSH_ALLOWED_CIDR=None, MLFLOW_DB="head"),
                                        tmp_path / "l.yaml", Hosts("10.1.0.2", (), "alice", key)).read_text())
    start = " ".join(local["head_start_ray_commands"])
    flag = re.search(r"--num-cpus=(\$\(\(.*?\)\))", start)
    assert flag and "--num-gpus" not in start, start
    offered = {}
    for cores in (16, 2):
        bin_dir = tmp_path / f"bin-{cores}"
        bin_dir.mkdir()
        (bin_dir / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
        (bin_dir / "nproc").chmod(0o755)
        offered[cores] = subprocess.run(["bash", "-c", f"echo {flag[1]}"], capture_output=True, text=True, check=True,
                                        env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout.strip()
    assert offered == {16: str(16 - HEAD_RESERVED_CPUS), 2: "0"}
    assert "--num-cpus=0" in " ".join(_config()["head_start_ray_commands"])  # AWS's head: an m6i, no training


def test_the_nodes_python_is_one_setting(tmp_path, cli):
    """cluster.yaml states the nodes' CPython where NODE_PYTHON_DEFAULT says; cluster.env's
    NODE_PYTHON replaces every mention (install, check, venv), and only a 3.11 release is taken."""
    from platform.cluster import NODE_PYTHON_DEFAULT

    stated = " ".join(_rendered(tmp_path)["worker_setup_commands"])
    assert stated.count(NODE_PYTHON_DEFAULT) == 3 and f"uv python install {NODE_PYTHON_DEFAULT}" in stated
    other = " ".join(_rendered(tmp_path, NODE_PYTHON="3.11.7")["worker_setup_commands"])
    assert NODE_PYTHON_DEFAULT not in other and other.count("3.11.7") == 3
    proc = cli("cluster", "render", "--env-file", str(_env_file(tmp_path, NODE_PYTHON="3.10.12")))
    assert proc.returncode == 2 and "must be a CPython 3.11 release" in proc.stderr


def test_on_your_own_machines_mlflow_serves_at_the_heads_address_you_gave(tmp_path):
    """A head on several networks lists another one first in ``hostname -I``: MLflow binds to, and
    the nodes' environment names, the ``--head`` address the workers were told."""
    from platform.cluster import FIRST_ADDRESS, Hosts, render_local

    key = tmp_path / "id_ed25519"
    key.write_text("not read here")
    env_file = _env_file(tmp_path, SSH_ALLOWED_CIDR=None, MLFLOW_DB="head")
    hosts = Hosts("192.168.50.10", ("192.168.50.11",), "alice", key)
    local = yaml.safe_load(render_local(ROOT / "cluster.yaml", env_file, tmp_path / "l.yaml", hosts).read_text())
    start = " ".join(local["head_start_ray_commands"])
    assert FIRST_ADDRESS not in start and "hostname -I" not in start
    assert 'HEAD_IP=192.168.50.10;' in start and '--host "$HEAD_IP"' in start
    assert '--head-ip "192.168.50.10"' in start


def test_machines_sharing_a_home_directory_keep_each_their_environment(tmp_path):
    """Lab machines often share one home directory (NFS): a worker's start must not replace the
    head's environment file, or every later shell on the head loses the MLflow server."""
    rendered = _rendered(tmp_path)
    home, env = throwaway_head(tmp_path, rendered)
    worker_bin = tmp_path / "worker-bin"
    worker_bin.mkdir()
    (worker_bin / "hostname").write_text('#!/bin/sh\n[ "$1" = -I ] && exec /bin/hostname -I\necho worker-7\n')
    (worker_bin / "hostname").chmod(0o755)
    write = next(c for c in rendered["worker_start_ray_commands"] if "node-env" in c)
    proc = subprocess.run(["bash", "-c", write], cwd=home, capture_output=True, text=True, timeout=120,
                          env={**env, "PATH": f"{worker_bin}:{env['PATH']}", "RAY_HEAD_IP": "10.0.0.9"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (home / "platform-env-worker-7.sh").is_file()
    seen = _seen(["bash", "-lic", "{}"], env, home)
    assert seen.get("MLFLOW_TRACKING_URI", "").endswith(":5000") and seen.get("PLATFORM_DATA_DIR") == f"{home}/data", seen


def test_a_home_shared_by_gpu_and_cpu_machines_stops_the_second_kind_with_one_line(tmp_path):
    """One ``~/venv`` seen by a CPU machine and a GPU machine (a lab's NFS home) would hold one
    torch build after the other: the second kind's setup stops, naming both, before installing."""
    from ray.autoscaler._private.command_runner import _with_interactive

    rendered = _rendered(tmp_path)
    home, drivers = _worker_home(tmp_path / "shared-home", tmp_path / "driver-bin", "580.65.06")
    skeleton = Path("/etc/skel/.bashrc").read_text()

    def setup(gpu: bool) -> subprocess.CompletedProcess:
        (home / ".bashrc").write_text((f"export PATH={drivers}:$PATH\n" if gpu else "") + skeleton)
        for command in rendered["worker_setup_commands"][-len(_config()["worker_setup_commands"]):]:  # the workers' own
            if "requirements/cuda.txt" in command and gpu:
                continue  # torch's CUDA build would need a GPU here; the guard before it is what is tested
            proc = subprocess.run(["bash", "-c", "exec " + " ".join(_with_interactive(command))], cwd=home,
                                  capture_output=True, text=True, timeout=120,
                                  env={"HOME": str(home), "PATH": "/usr/bin:/bin", "TERM": "dumb"})
            if proc.returncode != 0:
                return proc
        return proc

    assert setup(gpu=False).returncode == 0 and (home / "venv" / ".platform-lock").read_text().strip() == "cpu"
    installs = (home / "pip.log").read_text()
    gpu = setup(gpu=True)
    assert gpu.returncode != 0 and (home / "pip.log").read_text() == installs  # nothing more installed
    lines = [line for line in gpu.stderr.splitlines() if "torch's cuda build" in line]
    assert len(lines) == 1 and "holds the cpu build" in lines[0] and "home directory is shared" in lines[0], gpu.stderr


def test_down_and_the_head_start_stop_mlflow_with_one_command(tmp_path):
    """The head start's own item that stops an earlier MLflow server is what ``down`` runs on your
    own machines: run here, it ends the session of the process the pidfile names when that process
    is MLflow's, and leaves another process that the file names alone. (Each process is started as
    the head start starts MLflow's, ``setsid`` in a shell that exits: not this test's child.)"""
    from platform.cluster import stop_mlflow

    command = stop_mlflow(_config())
    pidfile = tmp_path / "mlflow" / "server.pid"
    pidfile.parent.mkdir()
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for name, stops in (("mlflow", True), ("other", False)):
        subprocess.run(["bash", "-c", f"setsid {sys.executable} -c 'import time; time.sleep(120)' {name} > /dev/null 2>&1 & "
                        f"echo $! > {pidfile}"], check=True)
        pid = int(pidfile.read_text())
        try:
            subprocess.run(["bash", "-c", command], env=env, check=True, timeout=90)
            assert Path(f"/proc/{pid}").exists() != stops
        finally:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
