"""What ``python -m platform.cluster up`` and ``down`` do in AWS, against an emulator of it (moto's
server on loopback, EC2, IAM with AWS's managed policies, S3), read back through the same APIs:

- the platform's security group and instance profiles, then Ray's own AWS bootstrap
  (``ray up``'s ``_bootstrap_config``) on the rendered config: no group open to the internet,
  every node type in the platform's group with its own instance profile, Ray's default role
  never made, and a worker Ray's node provider launches carries the workers' profile;
- the profiles' permissions: workers S3 under ``RUNS_URI`` only;
- the head's SQLite MLflow database backed up to S3 and restored on a new head; ``down`` that
  cannot back it up leaves the cluster up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, assert_user_error

REGION = "us-west-2"  # cluster.yaml's
CIDR = "81.2.69.0/24"
BUCKET = "platform-runs"


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """moto's server on a free loopback port; this process's AWS clients pointed at it."""
    from tests.topology import free_port

    port = free_port()
    base = tmp_path_factory.mktemp("moto")
    log = open(base / "moto.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true", "MOTO_ENABLE_RECORDING": "true",
                                 "MOTO_RECORDER_FILEPATH": str(base / "recording.jsonl")}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (base / "moto.log").read_text()[-2000:]
            time.sleep(0.3)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": REGION}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        os.killpg(proc.pid, 9)
        proc.wait()


@pytest.fixture()
def account(aws):
    """An empty AWS account (the emulator reset) with the run bucket."""
    import boto3

    urllib.request.urlopen(urllib.request.Request(aws + "/moto-api/reset", method="POST"), timeout=30)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET,
                                                         CreateBucketConfiguration={"LocationConstraint": REGION})
    return aws


def _settings(**extra) -> dict[str, str]:
    # The emulator has none of AWS's and Canonical's public /aws/service/ parameters (nor may anyone
    # write one): the images are named here, except where a test resolves one (GPU_IMAGE_ID=None).
    return {"CLUSTER_NAME": "contrastive-platform", "SSH_ALLOWED_CIDR": CIDR, "MLFLOW_TRACKING_USERNAME": "platform",
            "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery", "RUNS_URI": f"s3://{BUCKET}/runs",
            "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{BUCKET}/mlflow-artifacts", "GPU_IMAGE_ID": "ami-0fedcba9876543210",
            "UBUNTU_IMAGE_ID": "ami-0075013580f6322a1",
            **extra}


def _env_file(folder: Path, **extra) -> Path:
    path = folder / "cluster.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in _settings(**extra).items() if v is not None))
    return path


def _ec2():
    import boto3

    return boto3.client("ec2", region_name=REGION)


def _iam():
    import boto3

    return boto3.client("iam", region_name=REGION)


def _bootstrapped(tmp_path, access) -> dict:
    """The rendered cluster.yaml after Ray's own bootstrap (what ``ray up`` launches from)."""
    from ray.autoscaler._private.commands import _bootstrap_config

    from platform.cluster import render

    rendered = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml", access)
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path)  # Ray writes the cluster's SSH key under ~/.ssh
    try:
        return _bootstrap_config(yaml.safe_load(rendered.read_text()), no_config_cache=True)
    finally:
        os.environ["HOME"] = home or ""


def _ingress(group_id: str) -> list[dict]:
    (group,) = _ec2().describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    return group["IpPermissions"]


@pytest.mark.e2e
def test_rays_bootstrap_of_the_rendered_config_opens_nothing_and_gives_workers_their_profile(account, tmp_path):
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    from platform.cluster_aws import open_to_internet, provision

    access = provision(_settings(), "contrastive-platform", REGION)
    config = _bootstrapped(tmp_path, access)
    groups = _ec2().describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == ["contrastive-platform-nodes"]
    for group in groups:
        assert not open_to_internet(group.get("IpPermissions", [])), group
    rules = _ingress(access.security_group_id)
    ssh = [r for r in rules if r.get("FromPort") == 22]
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == [CIDR] and not ssh[0].get("Ipv6Ranges")
    within = [r for r in rules if r["IpProtocol"] == "-1"]
    assert [g["GroupId"] for g in within[0]["UserIdGroupPairs"]] == [access.security_group_id]
    assert len(rules) == 2
    nodes = config["available_node_types"]
    assert {k: n["node_config"]["SecurityGroupIds"] for k, n in nodes.items()} == {
        "head": [access.security_group_id], "gpu_worker": [access.security_group_id],
        "cpu_worker": [access.security_group_id]}
    assert nodes["head"]["node_config"]["IamInstanceProfile"] == {"Arn": access.head_profile_arn}
    assert nodes["gpu_worker"]["node_config"]["IamInstanceProfile"] == {"Arn": access.worker_profile_arn}
    profiles = {p["InstanceProfileName"] for p in _iam().list_instance_profiles()["InstanceProfiles"]}
    assert profiles == {"contrastive-platform-head", "contrastive-platform-worker"}  # not Ray's ray-autoscaler-v1
    # A worker as the head's autoscaler launches it: with the workers' profile, in the group.
    provider = AWSNodeProvider(config["provider"], config["cluster_name"])
    provider.create_node(nodes["gpu_worker"]["node_config"],
                         {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-name": "w",
                          "ray-launch-config": "hash"}, 1)  # the launcher always tags it (stopped nodes are reused by it)
    (instance,) = [i for r in _ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert instance["IamInstanceProfile"]["Arn"] == access.worker_profile_arn
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [access.security_group_id]


def _statements(role: str) -> list[dict]:
    iam = _iam()
    (name,) = iam.list_role_policies(RoleName=role)["PolicyNames"]
    return iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]["Statement"]


@pytest.mark.e2e
def test_workers_may_use_the_run_prefix_and_nothing_else(account):
    """Least privilege, read back from IAM: the workers' role has no managed policy and S3 actions
    on RUNS_URI's objects and listing only; the head's adds MLflow's locations, EC2 for the
    autoscaler and passing the workers' role, nothing more."""
    from platform.cluster_aws import provision

    access = provision(_settings(), "contrastive-platform", REGION)
    iam = _iam()
    assert iam.list_attached_role_policies(RoleName="contrastive-platform-worker")["AttachedPolicies"] == []
    worker = _statements("contrastive-platform-worker")
    resources = {r for s in worker for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
    assert resources == {f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/runs", f"arn:aws:s3:::{BUCKET}/runs/*"}
    assert all(a.startswith("s3:") and "*" not in a for s in worker for a in s["Action"])
    listing = [s for s in worker if s["Action"] == ["s3:ListBucket"]]
    assert listing[0]["Condition"] == {"StringLikeIfExists": {"s3:prefix": ["runs", "runs/*"]}}
    head = _statements("contrastive-platform-head")
    passes = [s for s in head if s["Action"] == ["iam:PassRole"]]
    assert passes[0]["Resource"] == access.worker_profile_arn.replace(":instance-profile/", ":role/")
    head_objects = {r for s in head if "s3:PutObject" in s["Action"] for r in s["Resource"]}
    assert head_objects == {f"arn:aws:s3:::{BUCKET}/{p}" for p in ("runs", "runs/*", "mlflow-artifacts", "mlflow-artifacts/*",
                                                                     "mlflow-db/mlflow.db", "mlflow-db/mlflow.db/*")}
    # EC2 for the autoscaler is the head's own statements (the cluster's instances only), no managed policy.
    assert iam.list_attached_role_policies(RoleName="contrastive-platform-head")["AttachedPolicies"] == []


@pytest.mark.e2e
def test_the_head_may_pass_the_role_a_named_worker_profile_holds(account):
    """A console-made pair: the profile and its role have other names, and the role a path. The
    head's ``iam:PassRole`` names that role as IAM has it, or every worker launch is refused."""
    from platform.cluster_aws import provision

    iam = _iam()
    role = iam.create_role(RoleName="lab-ec2-workers", Path="/lab/", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                "Action": "sts:AssumeRole"}]}))["Role"]
    profile = iam.create_instance_profile(InstanceProfileName="gpu-nodes")["InstanceProfile"]
    iam.add_role_to_instance_profile(InstanceProfileName="gpu-nodes", RoleName="lab-ec2-workers")
    provision(_settings(WORKER_INSTANCE_PROFILE_ARN=profile["Arn"]), "contrastive-platform", REGION)
    passes = [st for st in _statements("contrastive-platform-head") if st["Action"] == ["iam:PassRole"]]
    assert passes[0]["Resource"] == role["Arn"] == "arn:aws:iam::123456789012:role/lab/lab-ec2-workers"


@pytest.mark.e2e
def test_a_second_up_puts_the_group_back_and_makes_nothing_twice(account):
    """Someone opened SSH to the internet: the next up removes that rule; nothing is duplicated."""
    from platform.cluster_aws import open_to_internet, provision

    first = provision(_settings(), "contrastive-platform", REGION)
    _ec2().authorize_security_group_ingress(GroupId=first.security_group_id, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    assert open_to_internet(_ingress(first.security_group_id))
    again = provision(_settings(), "contrastive-platform", REGION)
    assert again.security_group_id == first.security_group_id and not again.created
    assert not open_to_internet(_ingress(first.security_group_id)) and len(_ingress(first.security_group_id)) == 2
    assert len(_iam().list_roles()["Roles"]) == 2


@pytest.mark.e2e
def test_a_named_group_open_to_the_internet_is_refused(account, tmp_path, cli):
    vpc = _ec2().describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = _ec2().create_security_group(GroupName="wide-open", Description="x", VpcId=vpc)["GroupId"]
    _ec2().authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}])
    config = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "cluster.yaml", config)
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path, SECURITY_GROUP_ID=group)))
    assert_user_error(proc, f"SECURITY_GROUP_ID={group} is open to the internet", "::/0")
    assert not (tmp_path / ".cluster").exists()


def _mlflow_db(path: Path, runs: int) -> Path:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{path}")
    experiment = client.create_experiment("una")
    for i in range(runs):
        run = client.create_run(experiment, run_name=f"trial-{i}")
        client.set_tag(run.info.run_id, "best_checkpoint", f"s3://{BUCKET}/runs/trial-{i}/checkpoint")
        client.set_terminated(run.info.run_id)
    return path


@pytest.mark.e2e
def test_the_head_database_is_backed_up_and_restored_on_a_new_head(account, tmp_path, cli):
    """What ``down`` runs on the head, then the new head's setup: every run and tag is back."""
    from mlflow.tracking import MlflowClient

    from platform.cluster_aws import db_backup_uri

    uri = db_backup_uri(_settings())
    assert uri == f"s3://{BUCKET}/mlflow-db/mlflow.db"  # beside the artifacts
    old = _mlflow_db(tmp_path / "old" / "mlflow.db", runs=3)
    proc = cli("cluster", "backup-db", str(old), uri)
    assert proc.returncode == 0 and "3 runs" in proc.stdout, proc.stderr
    new = tmp_path / "new-head" / "mlflow" / "mlflow.db"
    env_file = _env_file(tmp_path)
    proc = cli("cluster", "restore-db", str(new), "--env-file", str(env_file))
    assert proc.returncode == 0 and "restored" in proc.stdout, proc.stderr
    client = MlflowClient(f"sqlite:///{new}")
    runs = client.search_runs([client.get_experiment_by_name("una").experiment_id])
    assert sorted(r.data.tags["best_checkpoint"] for r in runs) == [f"s3://{BUCKET}/runs/trial-{i}/checkpoint" for i in range(3)]
    assert all(r.info.status == "FINISHED" for r in runs)
    # A head that already has its database keeps it (a second `ray up` on a live head).
    proc = cli("cluster", "restore-db", str(new), "--env-file", str(env_file))
    assert proc.returncode == 0 and "kept" in proc.stdout
    # A fresh database never replaces a backup holding more runs (a head that did not restore).
    empty = _mlflow_db(tmp_path / "empty" / "mlflow.db", runs=0)
    assert_user_error(cli("cluster", "backup-db", str(empty), uri), "holds 3 runs", "not replaced")
    assert_user_error(cli("cluster", "backup-db", str(tmp_path / "none.db"), uri), "no MLflow database at")


@pytest.mark.e2e
def test_down_leaves_the_cluster_up_when_the_database_cannot_be_backed_up(account, tmp_path, cli, monkeypatch):
    """Ray's launcher finds no head to back up from (``ray exec`` fails): ``down`` says so in one
    line and does not run ``ray down``; PostgreSQL's database is outside the cluster."""
    from platform.mlflow_backup import on_head

    monkeypatch.setattr("platform.cluster.settle", lambda access: None)  # EC2's wait for new IAM: not the emulator's

    config = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "cluster.yaml", config)
    env = {"HOME": str(tmp_path)}
    proc = cli("cluster", "down", "--config", str(config), "--env-file", str(_env_file(tmp_path, MLFLOW_DB="head")), "-y",
               env=env)
    assert_user_error(proc, "could not be backed up to s3://platform-runs/mlflow-db/mlflow.db", "still up",
                      "--discard-mlflow-db")
    assert (tmp_path / ".cluster" / "cluster.yaml").is_file()
    assert on_head(None) and on_head("sqlite:////home/ubuntu/mlflow/mlflow.db")
    assert not on_head("postgresql://mlflow@db.internal:5432/mlflow")
    assert_user_error(cli("cluster", "down", "--config", str(config), "--env-file", str(_env_file(tmp_path, MLFLOW_DB="head")),
                          "--backup-to", "/home/me/mlflow.db", env=env), "--backup-to must be an s3:// location")


@pytest.mark.e2e
def test_the_head_offers_ray_no_cpus_through_rays_own_fill_out_and_start_environment(account, tmp_path):
    """``ray up`` fills a node type's resources from its instance type (``AWSNodeProvider.
    fillout_available_node_types_resources``, inside ``_bootstrap_config``) and its updater exports
    them as ``RAY_OVERRIDE_RESOURCES`` before each start command, which wins over ``ray start
    --num-cpus`` (``ResourceAndLabelSpec``). The head's resources as Ray starts it, through those
    functions on the rendered config: no CPU, no GPU; a GPU worker keeps its instance's CPUs."""
    import json
    import re
    import subprocess

    from ray._private.ray_constants import RESOURCES_ENVIRONMENT_VARIABLE
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec
    from ray.autoscaler._private.command_runner import _with_environment_variables

    from platform.cluster_aws import provision

    config = _bootstrapped(tmp_path, provision(_settings(), "contrastive-platform", REGION))
    nodes = config["available_node_types"]
    worker = nodes["gpu_worker"]["resources"]
    assert worker["CPU"] == 8, worker  # the fill-out ran: g6e.2xlarge's vCPUs
    start = " ".join(config["head_start_ray_commands"])
    flags = re.search(r"ray start --head(?P<args>.*)$", start, re.S)
    num_cpus = re.search(r"--num-cpus[= ](\d+)", flags["args"])
    # The updater's export, as its command runner writes it, read back by a shell.
    export = _with_environment_variables("printenv " + RESOURCES_ENVIRONMENT_VARIABLE,
                                         {RESOURCES_ENVIRONMENT_VARIABLE: nodes["head"]["resources"]})
    seen = subprocess.run(["bash", "-c", export], capture_output=True, text=True, check=True).stdout.strip()
    saved = os.environ.get(RESOURCES_ENVIRONMENT_VARIABLE)
    os.environ[RESOURCES_ENVIRONMENT_VARIABLE] = seen
    try:
        spec = ResourceAndLabelSpec(num_cpus=int(num_cpus[1]) if num_cpus else None).resolve(is_head=True)
    finally:
        os.environ.pop(RESOURCES_ENVIRONMENT_VARIABLE) if saved is None else os.environ.__setitem__(
            RESOURCES_ENVIRONMENT_VARIABLE, saved)
    assert spec.num_cpus == 0 and spec.num_gpus == 0, (json.loads(seen), spec.num_cpus)


@pytest.mark.e2e
def test_rays_v2_autoscaler_runs_each_nodes_commands_once_as_the_launcher_gave_them(account, tmp_path):
    """``ray up`` on AWS starts Ray's v2 autoscaler, which reads the bootstrapped config back on the
    head (``FileConfigReader``) and prepares it a second time. Through its own classes, every node
    type's setup, start and initialization commands and its resources are the ones ``ray up``
    launched the head with: no command twice (a second merge of ``setup_commands`` would run each
    of them twice on every worker)."""
    from ray.autoscaler.v2.instance_manager.config import FileConfigReader

    from platform.cluster_aws import provision

    config = _bootstrapped(tmp_path, provision(_settings(), "contrastive-platform", REGION))
    head_copy = tmp_path / "ray_bootstrap_config.yaml"
    head_copy.write_text(json.dumps(config))  # as `ray up` writes it to the head
    v2 = FileConfigReader(str(head_copy), skip_content_hash=True).get_cached_autoscaling_config()
    assert v2.get_head_setup_commands() == config["head_setup_commands"]
    assert v2.get_head_start_ray_commands() == config["head_start_ray_commands"]
    assert v2.get_worker_start_ray_commands() == config["worker_start_ray_commands"]
    for node_type in ("gpu_worker", "cpu_worker"):
        setup = v2.get_worker_setup_commands(node_type)
        assert setup == config["worker_setup_commands"], node_type
        assert len(set(setup)) == len(setup) and any("uv venv" in c for c in setup), node_type
        assert v2.get_initialization_commands(node_type) == config.get("initialization_commands", [])
        assert v2.get_node_resources(node_type) == config["available_node_types"][node_type]["resources"]
    head = v2.get_head_setup_commands()
    assert len(set(head)) == len(head) and any("uv venv" in c for c in head)
    assert v2.get_node_resources("head") == {"CPU": 0, "GPU": 0}


def _recorded_s3(endpoint: str, during) -> list:
    """The S3 requests moto received while ``during()`` ran, as AWS authorises them."""
    from tests.aws_policy import is_s3, recorded, s3_requests

    post = lambda path: urllib.request.urlopen(urllib.request.Request(endpoint + path, method="POST"), timeout=30)  # noqa: E731
    post("/moto-api/recorder/reset-recording")
    post("/moto-api/recorder/start-recording")
    try:
        during()
    finally:
        post("/moto-api/recorder/stop-recording")
    text = urllib.request.urlopen(endpoint + "/moto-api/recorder/download-recording", timeout=30).read().decode()
    return [r for entry in recorded(text) if is_s3(entry) for r in s3_requests(entry)]


@pytest.mark.e2e
def test_what_the_platform_ray_and_mlflow_ask_of_s3_aws_allows_and_nothing_beyond(account, tmp_path):
    """The S3 requests of the real code on the cluster's locations, recorded by the emulator and
    judged by AWS's rules (tests/aws_policy.py) against the roles ``provision`` wrote: the
    platform's storage preflight and files (pyarrow's ``create_dir`` asks HeadBucket first), Ray
    Train's storage (validation file, checkpoint upload, listing, download, pruning) on RUNS_URI
    for the workers; MLflow's artifact store (what its proxy on the head does) and the database
    backup for the head. Requests outside those locations are refused."""
    from ray.train.v2._internal.execution.storage import (StorageContext, _download_from_fs_path, _list_at_fs_path,
                                                          delete_fs_path)

    from mlflow.store.artifact.s3_artifact_repo import S3ArtifactRepository

    from platform import storage
    from platform.cluster_aws import db_backup_uri, provision
    from platform.mlflow_backup import backup, restore
    from tests.aws_policy import Request, allowed

    values = _settings()
    provision(values, "contrastive-platform", REGION)
    worker, head = _statements("contrastive-platform-worker"), _statements("contrastive-platform-head")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"0" * 1024)

    def on_runs():
        sweep = values["RUNS_URI"] + "/una-sweep"
        storage.check_writable(sweep)
        storage.write_text(sweep + "/trial-0/state.json", "{}")
        assert storage.read_text(sweep + "/trial-0/state.json") == "{}" and storage.list_dirs(sweep) == ["trial-0"]
        context = StorageContext(sweep, "trial-0")
        from ray.train import Checkpoint

        saved = context.persist_current_checkpoint(Checkpoint(str(checkpoint)), "checkpoint_000000")
        assert _list_at_fs_path(context.storage_filesystem, saved.path) == ["model.safetensors"]
        _download_from_fs_path(context.storage_filesystem, saved.path, str(tmp_path / "down"))
        delete_fs_path(context.storage_filesystem, saved.path)
        storage.remove(sweep + "/trial-0")

    def on_mlflow():
        repo = S3ArtifactRepository(values["MLFLOW_ARTIFACTS_DESTINATION"] + "/1/run-id/artifacts")
        repo.log_artifacts(str(checkpoint), "model")
        assert [f.path for f in repo.list_artifacts("model")] == ["model/model.safetensors"]
        (tmp_path / "mlflow-down").mkdir()
        repo.download_artifacts("model", str(tmp_path / "mlflow-down"))
        repo.delete_artifacts("model")
        db = _mlflow_db(tmp_path / "db" / "mlflow.db", runs=1)
        backup(db, db_backup_uri(values), REGION)
        restore(tmp_path / "new" / "mlflow.db", db_backup_uri(values), REGION)

    # Arrow's S3 client first asks HeadBucket of a name S3 forbids ("$extremelyunlikelytoexist$"),
    # a probe whose answer it ignores: no policy can grant or refuse a bucket that cannot exist.
    probe = lambda r: "$" in r.resource  # noqa: E731
    runs_requests = [r for r in _recorded_s3(account, on_runs) if not probe(r)]
    head_requests = [r for r in _recorded_s3(account, on_mlflow) if not probe(r)]
    assert any(r.operation == "HeadBucket" for r in runs_requests), runs_requests  # what the prefix condition refused
    assert {r.operation for r in head_requests} >= {"PutObject", "GetObject", "ListObjectsV2", "DeleteObjects"}, head_requests
    refused = [f"worker: {r}" for r in runs_requests if not allowed(worker, r)]
    refused += [f"head: {r}" for r in runs_requests + head_requests if not allowed(head, r)]
    assert not refused, "\n".join(refused)
    # Nothing beyond: other keys, other prefixes' listings, other buckets, the bucket's own settings.
    outside = [Request("GetObject", "s3:GetObject", f"arn:aws:s3:::{BUCKET}/private/key"),
               Request("PutObject", "s3:PutObject", f"arn:aws:s3:::{BUCKET}/runsx/key"),
               Request("ListObjectsV2", "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": "private/"}),
               Request("HeadBucket", "s3:ListBucket", "arn:aws:s3:::another-bucket"),
               Request("PutBucketPolicy", "s3:PutBucketPolicy", f"arn:aws:s3:::{BUCKET}"),
               Request("DeleteBucket", "s3:DeleteBucket", f"arn:aws:s3:::{BUCKET}")]
    assert not [str(r) for r in outside if allowed(worker, r) or allowed(head, r)]
    mlflow_only = Request("PutObject", "s3:PutObject", f"arn:aws:s3:::{BUCKET}/mlflow-artifacts/1/x")
    assert allowed(head, mlflow_only) and not allowed(worker, mlflow_only)


@pytest.mark.e2e
def test_two_clusters_in_one_account_touch_nothing_of_each_others(account, tmp_path, monkeypatch):
    """Alice's and Bob's clusters (their own CLUSTER_NAME, SSH range and run prefix) in one
    account: each up makes its own group and roles, tagged with its name; Bob's up changes none of
    Alice's rules or permissions, and Ray's bootstrap of each rendered config names its own cluster."""
    from platform.cluster import provision_for
    from platform.cluster_aws import COST_TAG

    monkeypatch.setattr("platform.cluster.settle", lambda access: None)  # EC2's wait for new IAM: not the emulator's
    config = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "cluster.yaml", config)
    alice = _settings(CLUSTER_NAME="platform-alice", SSH_ALLOWED_CIDR="81.2.69.0/24", RUNS_URI=f"s3://{BUCKET}/alice")
    bob = _settings(CLUSTER_NAME="platform-bob", SSH_ALLOWED_CIDR="81.2.70.0/24", RUNS_URI=f"s3://{BUCKET}/bob")
    first = provision_for(config, alice)
    before = (_ingress(first.security_group_id), _statements("platform-alice-worker"), _statements("platform-alice-head"))
    second = provision_for(config, bob)
    assert second.security_group_id != first.security_group_id
    assert {second.head_profile_arn, second.worker_profile_arn}.isdisjoint({first.head_profile_arn, first.worker_profile_arn})
    assert (_ingress(first.security_group_id), _statements("platform-alice-worker"),
            _statements("platform-alice-head")) == before
    assert [r["CidrIp"] for p in _ingress(second.security_group_id) for r in p.get("IpRanges", [])] == ["81.2.70.0/24"]
    for name, access in (("platform-alice", first), ("platform-bob", second)):
        (group,) = _ec2().describe_security_groups(GroupIds=[access.security_group_id])["SecurityGroups"]
        assert {"Key": COST_TAG, "Value": name} in group.get("Tags", [])
        for role in (f"{name}-head", f"{name}-worker"):
            assert {"Key": COST_TAG, "Value": name} in _iam().list_role_tags(RoleName=role)["Tags"]
    from ray.autoscaler._private.commands import _bootstrap_config

    from platform.cluster import render

    home = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    try:
        names = {_bootstrap_config(yaml.safe_load(render(config, _env_file(tmp_path / n, **s), tmp_path / n / "r.yaml",
                                                         a).read_text()), no_config_cache=True)["cluster_name"]
                 for n, s, a in (("a", alice, first), ("b", bob, second))}
    finally:
        os.environ["HOME"] = home or ""
    assert names == {"platform-alice", "platform-bob"}


@pytest.mark.e2e
def test_mlflows_database_is_a_managed_postgresql_that_outlives_the_head(account, tmp_path, cli):
    """``up`` makes MLflow's PostgreSQL on RDS once (a second up finds it): in the cluster's group,
    not public, encrypted, deletion-protected, backed up daily for a week, tagged; its password only
    in an SSM SecureString that the head's role may read and the workers' may not. The rendered
    commands give the head its URI (never the password); the head's ``pgpass`` writes the password
    to an owner-only ~/.pgpass from SSM. No MLFLOW_DB=head: down backs nothing up and keeps it."""
    import boto3

    from platform.cluster import UP_FILE, render
    from platform.cluster_aws import COST_TAG, provision
    from tests.aws_policy import Request, allowed

    access = provision(_settings(), "contrastive-platform", REGION)
    rds = boto3.client("rds", region_name=REGION)
    (db,) = rds.describe_db_instances()["DBInstances"]
    assert db["DBInstanceIdentifier"] == "contrastive-platform-mlflow" and db["Engine"] == "postgres"
    assert db["DeletionProtection"] and db["StorageEncrypted"] and not db["PubliclyAccessible"]
    assert db["BackupRetentionPeriod"] >= 7
    assert [g["VpcSecurityGroupId"] for g in db["VpcSecurityGroups"]] == [access.security_group_id]
    assert {"Key": COST_TAG, "Value": "contrastive-platform"} in db["TagList"]
    host = db["Endpoint"]["Address"]
    assert access.database_uri == f"postgresql://mlflow@{host}:{db['Endpoint']['Port']}/mlflow"
    ssm = boto3.client("ssm", region_name=REGION)
    stored = ssm.get_parameter(Name=access.password_parameter, WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and len(stored["Value"]) >= 24
    again = provision(_settings(), "contrastive-platform", REGION)
    assert again.database_uri == access.database_uri and len(rds.describe_db_instances()["DBInstances"]) == 1
    assert ssm.get_parameter(Name=access.password_parameter, WithDecryption=True)["Parameter"]["Value"] == stored["Value"]
    account_id = boto3.client("sts", region_name=REGION).get_caller_identity()["Account"]
    read = Request("GetParameter", "ssm:GetParameter",
                   f"arn:aws:ssm:{REGION}:{account_id}:parameter{access.password_parameter}")
    assert allowed(_statements("contrastive-platform-head"), read)
    assert not allowed(_statements("contrastive-platform-worker"), read)
    # What the head is given: the URI in the rendered commands, never the password.
    rendered = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml", access).read_text()
    assert access.database_uri in rendered and stored["Value"] not in rendered and UP_FILE in rendered
    home = tmp_path / "head-home"
    home.mkdir()
    config = yaml.safe_load(rendered)
    learnt = next(c for c in config["head_setup_commands"] if UP_FILE in c)
    subprocess.run(["bash", "-c", learnt], env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True)
    proc = cli("cluster", "pgpass", "--env-file", str(_env_file(tmp_path)), env={"HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    pgpass = home / ".pgpass"
    assert pgpass.read_text() == f"{host}:{db['Endpoint']['Port']}:mlflow:mlflow:{stored['Value']}\n"
    assert oct(pgpass.stat().st_mode & 0o777) == "0o600"
    proc = cli("cluster", "restore-db", str(home / "mlflow" / "mlflow.db"), "--env-file", str(_env_file(tmp_path)),
               env={"HOME": str(home)})
    assert proc.returncode == 0 and not (home / "mlflow" / "mlflow.db").exists(), proc.stderr  # nothing on the head


@pytest.mark.e2e
def test_rays_autoscaler_puts_gpu_trials_on_gpu_nodes_and_cpu_work_on_cpu_nodes(account, tmp_path):
    """The node types as ``ray up`` fills them from AWS's instance types, given to Ray's own
    demand scheduler (v1's ``get_nodes_for``; v2 has the same rule, AUTOSCALER_CONSERVE_GPU_NODES):
    a trial's GPU workers launch GPU nodes of one GPU each, CPU-only generation tasks launch the
    CPU worker type, never a GPU node; the head takes nothing."""
    import functools

    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for

    from platform.cluster_aws import provision

    config = _bootstrapped(tmp_path, provision(_settings(), "contrastive-platform", REGION))
    nodes = config["available_node_types"]
    assert nodes["gpu_worker"]["resources"]["GPU"] == 1 and "GPU" not in nodes["cpu_worker"]["resources"]
    scorer = functools.partial(_default_utilization_scorer,
                               node_availability_summary=NodeAvailabilitySummary(node_availabilities={}))
    add = lambda demands: get_nodes_for(nodes, {}, "head", config["max_workers"], demands, scorer)[0]  # noqa: E731
    assert add([{"CPU": 1, "GPU": 1}] * 4) == {"gpu_worker": 4}  # the paper profile's 4 concurrent trials
    assert add([{"CPU": 1}] * 12) == {"cpu_worker": 1}
    assert add([{"CPU": 1}] * 32) == {"cpu_worker": 2}
    # Past the CPU nodes' 32 CPUs Ray does launch a GPU node for CPU work: that is its max_workers' price.
    assert add([{"CPU": 1}] * 40) == {"cpu_worker": 2, "gpu_worker": 1}


@pytest.mark.e2e
def test_an_idle_node_is_stopped_and_started_again_with_its_disk(account, tmp_path):
    """Ray's AWS node provider on the rendered config (cache_stopped_nodes): scaling a worker down
    stops its instance instead of terminating it, and the next scale-up of that type starts the
    same instance again (its venv and caches on its disk, the setup's installs no-ops), not a new
    one that would download the lock's wheels again (benchmarks/results/boot-bytes.jsonl)."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    from platform.cluster_aws import provision

    config = _bootstrapped(tmp_path, provision(_settings(), "contrastive-platform", REGION))
    assert config["provider"]["cache_stopped_nodes"] is True
    provider = AWSNodeProvider(config["provider"], config["cluster_name"])
    node = config["available_node_types"]["gpu_worker"]["node_config"]
    tags = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-name": "w",
            "ray-launch-config": "same-config"}
    (first,) = provider.create_node(node, dict(tags), 1)
    provider.terminate_node(first)  # what the autoscaler calls once the node was idle for idle_timeout_minutes
    (state,) = [i["State"]["Name"] for r in _ec2().describe_instances(InstanceIds=[first])["Reservations"]
                for i in r["Instances"]]
    assert state in ("stopping", "stopped")
    _ec2().get_waiter("instance_stopped").wait(InstanceIds=[first])
    again = provider.create_node(node, dict(tags), 1)
    assert list(again) == [first]
    instances = [i for r in _ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert len(instances) == 1 and instances[0]["State"]["Name"] in ("pending", "running")


@pytest.mark.e2e
def test_rays_v2_autoscaler_launches_stops_and_reuses_a_worker_of_this_config(account, tmp_path):
    """v2's own launcher (``NodeProviderAdapter`` over Ray's AWS provider, reading the head's copy of
    the bootstrapped config) launches a GPU worker with the workers' profile, the group, the pinned
    image and the cluster's tags, under the launch hash v1 computes for the same node type; scaled
    down it is stopped (cache_stopped_nodes) and the next launch starts that instance again."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.util import hash_launch_conf
    from ray.autoscaler.v2.instance_manager.config import FileConfigReader
    from ray.autoscaler.v2.instance_manager.node_provider import NodeProviderAdapter

    from platform.cluster_aws import COST_TAG, provision
    from tests.helpers import wait_for

    access = provision(_settings(), "contrastive-platform", REGION)
    config = _bootstrapped(tmp_path, access)
    head_copy = tmp_path / "ray_bootstrap_config.yaml"
    head_copy.write_text(json.dumps(config))  # as `ray up` writes it to the head
    adapter = NodeProviderAdapter(AWSNodeProvider(config["provider"], config["cluster_name"]),
                                  FileConfigReader(str(head_copy), skip_content_hash=True))

    def launched() -> dict:
        assert not adapter.poll_errors()
        return {k: v for k, v in adapter.get_non_terminated().items() if v.is_running}

    adapter.launch({"gpu_worker": 1}, "first")
    ((worker, cloud),) = wait_for("v2 to launch the worker", launched, timeout=60).items()
    assert cloud.node_type == "gpu_worker"
    (instance,) = [i for r in _ec2().describe_instances(InstanceIds=[worker])["Reservations"] for i in r["Instances"]]
    node = config["available_node_types"]["gpu_worker"]["node_config"]
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert instance["IamInstanceProfile"]["Arn"] == access.worker_profile_arn
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [access.security_group_id]
    assert instance["ImageId"] == node["ImageId"] == "ami-0fedcba9876543210"
    assert tags[COST_TAG] == tags["ray-cluster-name"] == "contrastive-platform"
    assert tags["ray-launch-config"] == hash_launch_conf(node, config["auth"])
    adapter.terminate([worker], "idle")
    _ec2().get_waiter("instance_stopped").wait(InstanceIds=[worker])
    adapter.launch({"gpu_worker": 1}, "again")
    assert list(wait_for("v2 to start the worker again", launched, timeout=60)) == [worker]
    for pool in (adapter._main_executor, adapter._node_launcher_executors):  # its launch ends before the emulator
        pool.shutdown(wait=True)
    assert not adapter.poll_errors()
    assert len([i for r in _ec2().describe_instances()["Reservations"] for i in r["Instances"]]) == 1


@pytest.mark.scenario
def test_the_readmes_ray_attach_path_lands_on_the_heads_mlflow_with_the_synced_commit(account, tmp_path, tiny_model,
                                                                                      small_corpus, _empty_mlflow_db):
    """The README's cluster path from a shell as ``ray attach`` opens it: up's AWS resources
    (emulated), the rendered commands run in a throwaway head HOME, then a command typed in a
    login shell there, from the synced repository, naming no store, output folder or commit. Its
    run is on the head's MLflow server (basic auth, the account from cluster.env), tagged with the
    commit up recorded, its checkpoints under RUNS_URI in S3. (What is emulated: the head's address,
    which the rendered node environment names and this test points at its own server; the sweep on
    a cluster is tests/platform/cluster/test_cluster_join.py's, ray job submit tests/platform/cluster/test_cluster_job.py's.)"""
    from mlflow.tracking import MlflowClient

    from platform.cluster import render
    from platform.cluster_aws import provision
    from tests.helpers import new_mlflow_db, sets
    from tests.services import MlflowServer, throwaway_head

    account_env = {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery"}
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="rayh-")  # this head's Ray (short: Ray's socket paths live under it)
    server = MlflowServer(tmp_path / "mlflow", new_mlflow_db(_empty_mlflow_db, tmp_path / "mlflow.db"),
                          account=account_env).start()
    try:
        access = provision(_settings(), "contrastive-platform", REGION)
        rendered = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml", access)
        aws_env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                              "AWS_DEFAULT_REGION")}  # the instance role's, emulated
        home, env = throwaway_head(tmp_path, yaml.safe_load(rendered.read_text()), aws_env)
        node_env = home / f"platform-env-{socket.gethostname()}.sh"
        lines = node_env.read_text().splitlines()
        node_env.write_text("\n".join(f"export MLFLOW_TRACKING_URI={server.uri}" if line.startswith(
            "export MLFLOW_TRACKING_URI=") else line for line in lines) + "\n")  # the head's address, emulated
        (home / "data").symlink_to(Path(os.environ["PLATFORM_DATA_DIR"]).resolve())  # `platform.data fetch` did this
        env["RAY_TMPDIR"] = ray_tmp
        typed = " ".join(["cd", str(ROOT), "&&", "python -m platform.train simcse", *sets(
            model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, num_workers=1,
            use_gpu="false", final_eval="false")])
        proc = subprocess.run(["bash", "-lic", typed], cwd=home, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        saved = {k: os.environ.get(k) for k in account_env}
        os.environ.update(account_env)
        try:
            client = MlflowClient(server.uri)
            (run,) = client.search_runs([client.get_experiment_by_name("simcse").experiment_id])
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        assert run.info.status == "FINISHED" and run.data.tags["git_commit"] == commit
        assert run.data.tags["best_checkpoint"].startswith(f"s3://{BUCKET}/runs/"), run.data.tags["best_checkpoint"]
    finally:
        server.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.e2e
def test_a_sweeps_bill_is_each_instance_from_its_launch_to_its_stop(account, tmp_path):
    """What the sweep's end records on a cluster ``up`` made: the hours AWS bills each instance Ray's
    launcher tagged with the cluster's name (launch to stop, or to the end of the accounted span),
    by node type; another cluster's instances are not counted."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    from platform.cluster_aws import provision
    from platform.cluster_aws import billed_hours

    config = _bootstrapped(tmp_path, provision(_settings(), "contrastive-platform", REGION))
    nodes = config["available_node_types"]

    def launch(cluster: str, kind: str) -> str:
        provider = AWSNodeProvider(config["provider"], cluster)
        (made,) = provider.create_node(nodes[kind]["node_config"], {
            "ray-node-type": "worker", "ray-user-node-type": kind, "ray-node-name": kind,
            "ray-launch-config": kind}, 1)
        return made, provider

    gpu, _ = launch("contrastive-platform", "gpu_worker")
    cpu, provider = launch("contrastive-platform", "cpu_worker")
    launch("someone-else", "gpu_worker")
    provider.terminate_node(cpu)  # idle: stopped (cache_stopped_nodes)
    _ec2().get_waiter("instance_stopped").wait(InstanceIds=[cpu])
    launched = {i["InstanceId"]: i["LaunchTime"].timestamp() for r in _ec2().describe_instances()["Reservations"]
                for i in r["Instances"]}
    until = time.time() + 3600  # an hour on: the running one keeps billing, the stopped one does not
    bill = billed_hours("contrastive-platform", since_s=0, until_s=until)
    assert bill["billed_node_hours/gpu_worker"] == pytest.approx((until - launched[gpu]) / 3600, abs=1e-3)
    assert bill["billed_node_hours/cpu_worker"] < 0.02
    assert bill["billed_node_hours"] == pytest.approx(bill["billed_node_hours/gpu_worker"]
                                                      + bill["billed_node_hours/cpu_worker"])


@pytest.mark.e2e
def test_down_terminates_every_instance_of_the_cluster_and_says_what_stays_billed(account, tmp_path, cli):
    """Ray's provider stops nodes (cache_stopped_nodes), the head's too in ``ray down``, and their
    disks bill on: ``down`` terminates every instance of the cluster, running or stopped, of this
    configuration or an older one, leaves another cluster's alone, and names what stays billed
    (the database, the bucket) with its monthly cost. Without a rendered config it needs no
    launcher and makes nothing (rendering would make the RDS database just to tear it down)."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    from platform.cluster_aws import provision

    config = _bootstrapped(tmp_path, provision(_settings(MLFLOW_DB="head"), "contrastive-platform", REGION))
    node = config["available_node_types"]["cpu_worker"]["node_config"]

    def launch(cluster: str, launch_config: str) -> tuple[str, AWSNodeProvider]:
        provider = AWSNodeProvider(config["provider"], cluster)
        (made,) = provider.create_node(node, {"ray-node-type": "worker", "ray-user-node-type": "cpu_worker",
                                              "ray-node-name": "w", "ray-launch-config": launch_config}, 1)
        return made, provider

    stopped, provider = launch("contrastive-platform", "older-config")
    provider.terminate_node(stopped)  # stopped, not terminated
    running, _ = launch("contrastive-platform", "this-config")
    other, _ = launch("someone-else", "this-config")
    _ec2().get_waiter("instance_stopped").wait(InstanceIds=[stopped])
    proc = cli("cluster", "down", "--config", str(ROOT / "cluster.yaml"), "--env-file", str(_env_file(tmp_path)),
               env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    states = {i["InstanceId"]: i["State"]["Name"] for r in _ec2().describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert states[stopped] == states[running] == "terminated" and states[other] != "terminated"
    assert "terminated 2 instance(s) of contrastive-platform" in proc.stdout
    assert "kept: MLflow's database contrastive-platform-mlflow (RDS db.t4g.micro, 20 GB): about $14 a month" in proc.stdout
    assert f"kept: the bucket(s) {BUCKET}" in proc.stdout
    import boto3

    assert boto3.client("rds", region_name=REGION).describe_db_instances()["DBInstances"] == []  # nothing made


@pytest.mark.e2e
def test_code_on_the_head_can_touch_only_this_clusters_instances(account, tmp_path):
    """The head's role, read back from IAM and judged by AWS's evaluation rules (tests/aws_policy.py,
    conditions included): what Ray's AWS provider does there (describe, launch into the cluster's
    group with the tags render gives every instance and disk, tag, start, stop, terminate, pass the
    workers' role) is allowed; the same on another cluster's or anyone's instance, a launch without
    the cluster's tag or into another group, moving the tag onto a foreign instance, and passing
    another role are refused. No managed policy (AmazonEC2FullAccess was any instance's)."""
    from platform.cluster import render
    from platform.cluster_aws import COST_TAG, provision
    from tests.aws_policy import Request, allowed

    access = provision(_settings(), "contrastive-platform", REGION)
    head = _statements("contrastive-platform-head")
    rendered = yaml.safe_load(render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "r.yaml", access).read_text())
    specs = rendered["available_node_types"]["gpu_worker"]["node_config"]["TagSpecifications"]
    launched = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]} for s in specs}
    ours, theirs = "contrastive-platform", "someone-else"
    instance = "arn:aws:ec2:us-west-2:123456789012:instance/i-0123456789abcdef0"
    group = f"arn:aws:ec2:us-west-2:123456789012:security-group/{access.security_group_id}"

    def run(resource: str, tags: dict) -> Request:
        return Request("RunInstances", "ec2:RunInstances", resource,
                       {"aws:RequestTag/" + k: v for k, v in tags.items()} | {"aws:TagKeys": list(tags)})

    def on(action: str, owner: str, **context) -> Request:
        return Request(action.split(":")[1], action, instance, {f"aws:ResourceTag/{COST_TAG}": owner, **context})

    worker_role = access.worker_profile_arn.replace(":instance-profile/", ":role/")
    may = [
        Request("DescribeInstances", "ec2:DescribeInstances", "*"),
        Request("DescribeInstanceTypes", "ec2:DescribeInstanceTypes", "*"),
        run(instance, launched["instance"] | {"ray-cluster-name": ours}),
        run("arn:aws:ec2:us-west-2:123456789012:volume/vol-0123456789abcdef0", launched["volume"]),
        run(group, {}), run("arn:aws:ec2:us-west-2::image/ami-0d3d3d5d6c1e2c9b4", {}),
        run("arn:aws:ec2:us-west-2:123456789012:subnet/subnet-1", {}),
        Request("CreateTags", "ec2:CreateTags", instance, {"ec2:CreateAction": "RunInstances"}),
        on("ec2:CreateTags", ours, **{"aws:TagKeys": ["ray-node-status"]}),
        on("ec2:StartInstances", ours), on("ec2:StopInstances", ours), on("ec2:TerminateInstances", ours),
        Request("PassRole", "iam:PassRole", worker_role),
    ]
    may_not = [
        on("ec2:TerminateInstances", theirs), on("ec2:StopInstances", theirs),
        Request("TerminateInstances", "ec2:TerminateInstances", instance),  # an untagged instance of the account
        run(instance, {"ray-cluster-name": ours}),  # without the cluster's tag
        run(instance, {COST_TAG: theirs}),
        run("arn:aws:ec2:us-west-2:123456789012:security-group/sg-0ffffffffffffffff", {}),
        on("ec2:CreateTags", theirs, **{"aws:TagKeys": [COST_TAG]}),
        on("ec2:CreateTags", ours, **{"aws:TagKeys": [COST_TAG]}),
        Request("CreateTags", "ec2:CreateTags", instance, {"aws:TagKeys": [COST_TAG]}),
        Request("AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupIngress", group),
        Request("CreateSnapshot", "ec2:CreateSnapshot", "arn:aws:ec2:us-west-2::snapshot/*"),
        Request("PassRole", "iam:PassRole", "arn:aws:iam::123456789012:role/admin"),
    ]
    assert [str(r) for r in may if not allowed(head, r)] == []
    assert [str(r) for r in may_not if allowed(head, r)] == []
    assert _iam().list_attached_role_policies(RoleName="contrastive-platform-head")["AttachedPolicies"] == []


@pytest.mark.e2e
def test_the_head_may_use_a_named_ebs_key_for_the_workers_disks_and_no_other(account):
    """An account that encrypts new EBS volumes with its own KMS key: launching a worker asks the head
    for that key's grant (for EC2 itself), data keys and decryption. Named in cluster.env, the head's
    role gets them on that key alone; unnamed, on none."""
    from platform.cluster_aws import provision
    from tests.aws_policy import Request, allowed

    key = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    other = "arn:aws:kms:us-west-2:123456789012:key/ffffffff-12ab-34cd-56ef-1234567890ab"

    def grant(on: str, for_aws: bool | None) -> Request:
        return Request("CreateGrant", "kms:CreateGrant", on, {} if for_aws is None else {"kms:GrantIsForAWSResource": for_aws})

    launch = [grant(key, True), *(Request(a.split(":")[1], a, key) for a in (
        "kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncryptFrom", "kms:ReEncryptTo"))]
    provision(_settings(EBS_KMS_KEY_ARN=key), "contrastive-platform", REGION)
    head = _statements("contrastive-platform-head")
    assert [str(r) for r in launch if not allowed(head, r)] == []
    refused = [grant(key, False), grant(key, None), grant(other, True), Request("Decrypt", "kms:Decrypt", other),
               Request("ScheduleKeyDeletion", "kms:ScheduleKeyDeletion", key)]
    assert [str(r) for r in refused if allowed(head, r)] == []
    provision(_settings(), "contrastive-platform", REGION)  # the key no longer named: the policy is written again
    assert not any(allowed(_statements("contrastive-platform-head"), r) for r in launch)


@pytest.mark.e2e
def test_the_gpu_image_is_the_one_aws_publishes_now(account, tmp_path, cli, monkeypatch):
    """cluster.yaml names the GPU workers' image by the public SSM parameter AWS keeps current for
    the Deep Learning Base GPU AMI; ``up`` (render) puts in the ID it holds in the cluster's region,
    and a parameter the region lacks is one line, nothing rendered. (AWS's ``/aws/service/`` names are
    reserved, in moto too: the test's copy of cluster.yaml names its own parameter.)"""
    import boto3

    monkeypatch.setattr("platform.cluster.settle", lambda access: None)
    text = (ROOT / "cluster.yaml").read_text()
    published = re.search(r"ImageId: (resolve:ssm:/aws/service/deeplearning/\S+)", text).group(1)
    config = tmp_path / "cluster.yaml"
    config.write_text(text.replace(published, "resolve:ssm:/platform-test/gpu-image"))
    boto3.client("ssm", region_name=REGION).put_parameter(Name="/platform-test/gpu-image", Value="ami-0123456789abcdef0",
                                                          Type="String")
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path, GPU_IMAGE_ID=None)))
    assert proc.returncode == 0, proc.stderr
    nodes = yaml.safe_load((tmp_path / ".cluster" / "cluster.yaml").read_text())["available_node_types"]
    assert nodes["gpu_worker"]["node_config"]["ImageId"] == "ami-0123456789abcdef0"
    assert nodes["head"]["node_config"]["ImageId"].startswith("ami-")
    shutil.rmtree(tmp_path / ".cluster")
    config.write_text(text.replace(published, "resolve:ssm:/platform-test/no-such-image"))
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path, GPU_IMAGE_ID=None)))
    assert_user_error(proc, "no image parameter /platform-test/no-such-image in us-west-2", "GPU_IMAGE_ID=ami-")
    assert not (tmp_path / ".cluster").exists()
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path)))  # named instead
    assert proc.returncode == 0, proc.stderr
    nodes = yaml.safe_load((tmp_path / ".cluster" / "cluster.yaml").read_text())["available_node_types"]
    assert nodes["gpu_worker"]["node_config"]["ImageId"] == "ami-0fedcba9876543210"


@pytest.mark.e2e
def test_the_gpu_image_stays_pinned_across_ups_until_a_refresh(account, tmp_path, cli, monkeypatch):
    """AWS's parameter names a new image whenever AWS publishes one: a second ``up`` after that keeps
    the image of the first (the GPU workers' launch hash, as Ray's launcher computes it, unchanged:
    stopped workers are reused, running ones stay); ``--refresh-images`` takes the new one."""
    import boto3
    from ray.autoscaler._private.util import hash_launch_conf

    monkeypatch.setattr("platform.cluster.settle", lambda access: None)
    text = (ROOT / "cluster.yaml").read_text()
    published = re.search(r"ImageId: (resolve:ssm:/aws/service/deeplearning/\S+)", text).group(1)
    config = tmp_path / "cluster.yaml"
    config.write_text(text.replace(published, "resolve:ssm:/platform-test/gpu-image"))
    ssm = boto3.client("ssm", region_name=REGION)

    def gpu_worker(*extra: str) -> tuple[str, str]:
        proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path, GPU_IMAGE_ID=None)),
                   *extra)
        assert proc.returncode == 0, proc.stderr
        rendered = yaml.safe_load((tmp_path / ".cluster" / "cluster.yaml").read_text())
        node = rendered["available_node_types"]["gpu_worker"]["node_config"]
        return node["ImageId"], hash_launch_conf(node, rendered["auth"])

    ssm.put_parameter(Name="/platform-test/gpu-image", Value="ami-0123456789abcdef0", Type="String")
    first = gpu_worker()
    ssm.put_parameter(Name="/platform-test/gpu-image", Value="ami-0aaaaaaaaaaaaaaaa", Type="String", Overwrite=True)
    assert gpu_worker() == first and first[0] == "ami-0123456789abcdef0"
    refreshed = gpu_worker("--refresh-images")
    assert refreshed[0] == "ami-0aaaaaaaaaaaaaaaa" and refreshed[1] != first[1]
    assert gpu_worker() == refreshed  # the refreshed image is the pinned one now


@pytest.mark.e2e
def test_a_named_group_whose_nodes_cannot_reach_each_other_is_refused(account, tmp_path, cli, monkeypatch):
    """Ray's nodes talk on many ports and MLflow's database sits in the same group: a group named in
    cluster.env must admit all traffic from itself, else one line before anything is made."""
    monkeypatch.setattr("platform.cluster.settle", lambda access: None)  # EC2's wait for new IAM: not the emulator's
    vpc = _ec2().describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = _ec2().create_security_group(GroupName="ssh-only", Description="x", VpcId=vpc)["GroupId"]
    _ec2().authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": CIDR}]}])
    config = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "cluster.yaml", config)
    proc = cli("cluster", "render", "--config", str(config), "--env-file", str(_env_file(tmp_path, SECURITY_GROUP_ID=group)))
    assert_user_error(proc, f"SECURITY_GROUP_ID={group} does not admit its own members")
    assert not (tmp_path / ".cluster").exists()
    _ec2().authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}])
    assert "does not admit" not in cli("cluster", "render", "--config", str(config), "--env-file",
                                       str(_env_file(tmp_path, SECURITY_GROUP_ID=group, MLFLOW_DB="head"))).stderr
