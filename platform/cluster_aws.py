"""The AWS resources the nodes of ``cluster.yaml`` use, made by the platform because Ray's
bootstrap would make them open or too wide (``python -m platform.cluster up`` calls ``provision``):

- one security group for every node: SSH only from ``SSH_ALLOWED_CIDR``, everything between the
  cluster's own nodes, nothing else. Ray's bootstrap adds SSH from 0.0.0.0/0 to every group it
  creates and never corrects a group that already has rules; it creates none when every node
  type names its groups (``SecurityGroupIds``), which the rendered config does.
- MLflow's PostgreSQL on RDS (unless ``MLFLOW_DB=head`` or ``MLFLOW_BACKEND_STORE_URI``), in
  that group, its password in an SSM SecureString only the head may read.
- two instance profiles. Workers get S3 on the run prefix (``RUNS_URI``: checkpoints, Tune state)
  and nothing else. The head also gets the MLflow artifact location and the database backup
  (its MLflow server writes them; clients go through the server), EC2 (Ray's autoscaler starts
  and stops the workers: only instances tagged with the cluster's name, ``autoscaler_policy``) and
  ``iam:PassRole`` for the workers' role only. Ray's default head role has S3 full access,
  EC2 full access (any instance of the account) and cannot pass a worker role.

Existing resources can be named instead (``SECURITY_GROUP_ID``, ``HEAD_INSTANCE_PROFILE_ARN``,
``WORKER_INSTANCE_PROFILE_ARN`` in ``cluster.env``); a named group open to the internet is refused.
Everything here is idempotent: a second ``up`` finds what the first made and puts the group's
rules and the roles' policies back to what they should be.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import time
from dataclasses import dataclass

from platform.errors import ConfigError

TRUST_EC2 = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                  "s3:ListMultipartUploadParts"]
INTERNET = ("0.0.0.0/0", "::/0")
COST_TAG = "platform-cluster"  # on everything up makes: activate it as a cost-allocation tag in Billing


def cost_tags(cluster_name: str) -> list[dict]:
    return [{"Key": COST_TAG, "Value": cluster_name}]


@dataclass
class Access:
    security_group_id: str
    head_profile_arn: str
    worker_profile_arn: str
    created: bool = False  # something new in IAM: EC2 sees it only after a few seconds
    database_uri: str = ""  # MLflow's backend store when up made it (RDS), without its password
    password_parameter: str = ""  # the SSM parameter that holds that password
    images: dict | None = None  # {"resolve:ssm:NAME": the image ID the parameter names now}


# MLflow's record lives in a managed PostgreSQL outside the head (MLFLOW_DB=rds, the default):
# a plain `ray down`, a failed head or `ray up` replacing the head lose no run, metric, model
# version or account. Small and cheap: MLflow's tracking load is a few writes a second.
DB_ENGINE_VERSION = "16"
DB_INSTANCE_CLASS = "db.t4g.micro"
DB_STORAGE_GB = 20
DB_BACKUP_DAYS = 7
DB_USER = "mlflow"
DB_NAME = "mlflow"


def db_identifier(cluster_name: str) -> str:
    return f"{cluster_name}-mlflow"


def password_parameter(cluster_name: str) -> str:
    return f"/{cluster_name}/mlflow-db-password"


def mlflow_database(rds, ssm, cluster_name: str, group_id: str, wait: bool = True) -> tuple[str, str]:
    """MLflow's PostgreSQL on RDS for ``cluster_name``, made once and found after: inside the
    cluster's security group (only its nodes reach it), not public, encrypted, deletion-protected,
    with automated backups; its password made here and kept only in an SSM SecureString that the
    head's role may read. ``(database URI without the password, the password's parameter)``."""
    import secrets

    identifier, parameter = db_identifier(cluster_name), password_parameter(cluster_name)
    try:
        (instance,) = rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"]
    except rds.exceptions.DBInstanceNotFoundFault:
        password = secrets.token_urlsafe(24)
        ssm.put_parameter(Name=parameter, Value=password, Type="SecureString", Overwrite=True,
                          Description=f"{cluster_name}: MLflow's database password (python -m platform.cluster up)")
        instance = rds.create_db_instance(
            DBInstanceIdentifier=identifier, Engine="postgres", EngineVersion=DB_ENGINE_VERSION,
            DBInstanceClass=DB_INSTANCE_CLASS, AllocatedStorage=DB_STORAGE_GB, StorageType="gp3",
            DBName=DB_NAME, MasterUsername=DB_USER, MasterUserPassword=password,
            VpcSecurityGroupIds=[group_id], PubliclyAccessible=False, StorageEncrypted=True,
            DeletionProtection=True, BackupRetentionPeriod=DB_BACKUP_DAYS, CopyTagsToSnapshot=True,
            Tags=cost_tags(cluster_name))["DBInstance"]
    if wait and instance.get("DBInstanceStatus") != "available":
        rds.get_waiter("db_instance_available").wait(DBInstanceIdentifier=identifier,
                                                     WaiterConfig={"Delay": 30, "MaxAttempts": 60})
        (instance,) = rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"]
    endpoint = instance["Endpoint"]
    return f"postgresql://{DB_USER}@{endpoint['Address']}:{endpoint['Port']}/{DB_NAME}", parameter


def s3_location(uri: str, what: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://bucket/prefix`` URI."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise ConfigError(f"{what} must be an s3:// location, got {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix.strip("/")


def bucket_policy(locations: dict[str, str]) -> list[dict]:
    """S3 statements that allow objects under each ``s3://bucket/prefix`` and listing them, nothing else."""
    statements = []
    for what, uri in locations.items():
        bucket, prefix = s3_location(uri, what)
        keys = [f"arn:aws:s3:::{bucket}/{prefix}", f"arn:aws:s3:::{bucket}/{prefix}/*"] if prefix else [f"arn:aws:s3:::{bucket}/*"]
        statements.append({"Effect": "Allow", "Action": OBJECT_ACTIONS, "Resource": keys})
        listing = {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"}
        if prefix:
            # IfExists: HeadBucket is authorised by s3:ListBucket and carries no s3:prefix, so a
            # plain StringLike refuses it, and pyarrow's create_dir (Ray Train's and Tune's
            # storage, the output_dir check) asks it first (apache/arrow#49949). A listing with a
            # prefix stays confined; one without a prefix shows the bucket's key names, not contents.
            listing["Condition"] = {"StringLikeIfExists": {"s3:prefix": [prefix, f"{prefix}/*"]}}
        statements.append(listing)
        statements.append({"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": f"arn:aws:s3:::{bucket}"})
    return statements


def wanted_ingress(group_id: str, cidr: str) -> list[dict]:
    network = ipaddress.ip_network(cidr, strict=False)
    ranges = ({"Ipv6Ranges": [{"CidrIpv6": str(network), "Description": "SSH_ALLOWED_CIDR"}]} if network.version == 6
              else {"IpRanges": [{"CidrIp": str(network), "Description": "SSH_ALLOWED_CIDR"}]})
    return [
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges},
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "the cluster's own nodes"}]},
    ]


def _rule_keys(permissions: list[dict]) -> set[tuple]:
    """Each (protocol, ports, source) of a group's rules, comparable across what AWS returns."""
    keys = set()
    for p in permissions:
        base = (p.get("IpProtocol"), p.get("FromPort", -1) if p.get("IpProtocol") != "-1" else -1,
                p.get("ToPort", -1) if p.get("IpProtocol") != "-1" else -1)
        keys |= {(*base, "v4", r["CidrIp"]) for r in p.get("IpRanges", [])}
        keys |= {(*base, "v6", r["CidrIpv6"]) for r in p.get("Ipv6Ranges", [])}
        keys |= {(*base, "sg", g["GroupId"]) for g in p.get("UserIdGroupPairs", [])}
        keys |= {(*base, "pl", pl["PrefixListId"]) for pl in p.get("PrefixListIds", [])}
    return keys


def _permission(key: tuple) -> dict:
    protocol, low, high, kind, source = key
    rule = {"IpProtocol": protocol}
    if protocol != "-1":
        rule.update(FromPort=low, ToPort=high)
    field = {"v4": ("IpRanges", "CidrIp"), "v6": ("Ipv6Ranges", "CidrIpv6"), "sg": ("UserIdGroupPairs", "GroupId"),
             "pl": ("PrefixListIds", "PrefixListId")}[kind]
    rule[field[0]] = [{field[1]: source}]
    return rule


def open_to_internet(permissions: list[dict]) -> list[str]:
    """The rules of a group that admit any address ("tcp 22 from 0.0.0.0/0")."""
    return [f"{k[0]} {k[1]}-{k[2]} from {k[4]}" for k in sorted(_rule_keys(permissions), key=str)
            if k[3] in ("v4", "v6") and k[4] in INTERNET]


def security_group(ec2, name: str, cidr: str, cluster_name: str) -> str:
    """The nodes' group in the region's default VPC, its ingress exactly ``wanted_ingress``."""
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise ConfigError("this region has no default VPC: create a security group yourself (SSH from your range, "
                          "all traffic within the group) and set SECURITY_GROUP_ID in cluster.env")
    vpc = vpcs[0]["VpcId"]
    found = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                  {"Name": "group-name", "Values": [name]}])["SecurityGroups"]
    if found:
        group_id, current = found[0]["GroupId"], found[0].get("IpPermissions", [])
    else:
        group_id = ec2.create_security_group(GroupName=name, VpcId=vpc, Description=(
            f"{cluster_name} nodes: SSH from SSH_ALLOWED_CIDR, all traffic within the group"), TagSpecifications=[
                {"ResourceType": "security-group", "Tags": cost_tags(cluster_name)}])["GroupId"]
        current = []
    have, want = _rule_keys(current), _rule_keys(wanted_ingress(group_id, cidr))
    if have - want:
        ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=[_permission(k) for k in sorted(have - want, key=str)])
    if want - have:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[_permission(k) for k in sorted(want - have, key=str)])
    return group_id


def named_security_group(ec2, group_id: str) -> str:
    """A group the user named: it must exist and admit no one from the whole internet."""
    try:
        (group,) = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    except ec2.exceptions.ClientError as exc:  # the group is not there (other refusals: cluster.aws_call)
        raise ConfigError(f"SECURITY_GROUP_ID={group_id}: {exc}") from None
    wide = open_to_internet(group.get("IpPermissions", []))
    if wide:
        raise ConfigError(f"SECURITY_GROUP_ID={group_id} is open to the internet ({', '.join(wide)}): remove those "
                          "rules or leave SECURITY_GROUP_ID unset for the platform's own group")
    own = [p for p in group.get("IpPermissions", []) if p.get("IpProtocol") == "-1"
           and any(pair.get("GroupId") == group_id for pair in p.get("UserIdGroupPairs", []))]
    if not own:
        raise ConfigError(f"SECURITY_GROUP_ID={group_id} does not admit its own members: Ray's nodes and MLflow's "
                          f"database in it could not reach each other; add an inbound rule for all traffic from "
                          f"{group_id}, or leave SECURITY_GROUP_ID unset for the platform's own group")
    return group_id


def instance_profile(iam, name: str, policy: list[dict], managed: tuple[str, ...] = (),
                     tags: list[dict] = ()) -> tuple[str, bool]:
    """An instance profile ``name`` with a role of the same name whose permissions are exactly the
    inline ``policy`` and the ``managed`` policies; ``(its ARN, whether anything was created)``."""
    created = False
    try:
        iam.get_role(RoleName=name)
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(TRUST_EC2), Tags=list(tags),
                        Description="contrastive-platform cluster nodes (python -m platform.cluster up)")
        created = True
    iam.put_role_policy(RoleName=name, PolicyName=name, PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": policy}))
    for extra in iam.list_role_policies(RoleName=name)["PolicyNames"]:
        if extra != name:
            iam.delete_role_policy(RoleName=name, PolicyName=extra)
    attached = {p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]}
    for arn in set(managed) - attached:
        iam.attach_role_policy(RoleName=name, PolicyArn=arn)
    for arn in attached - set(managed):
        iam.detach_role_policy(RoleName=name, PolicyArn=arn)
    try:
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except iam.exceptions.NoSuchEntityException:
        profile = iam.create_instance_profile(InstanceProfileName=name, Tags=list(tags))["InstanceProfile"]
        created = True
    if name not in [r["RoleName"] for r in profile.get("Roles", [])]:
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        created = True
    return profile["Arn"], created


def provision(values: dict[str, str], cluster_name: str, region: str, session=None) -> Access:
    """The group and the instance profiles the rendered config names (``values``: cluster.env)."""
    import boto3

    session = session or boto3.session.Session(region_name=region)
    ec2, iam = session.client("ec2", region_name=region), session.client("iam", region_name=region)
    rds, ssm = session.client("rds", region_name=region), session.client("ssm", region_name=region)
    if values.get("SECURITY_GROUP_ID"):
        group_id = named_security_group(ec2, values["SECURITY_GROUP_ID"])
    else:
        group_id = security_group(ec2, f"{cluster_name}-nodes", values["SSH_ALLOWED_CIDR"], cluster_name)
    runs = {"RUNS_URI": values["RUNS_URI"]}
    created = False
    database_uri = parameter = ""
    if mlflow_db(values) == "rds":
        database_uri, parameter = mlflow_database(rds, ssm, cluster_name, group_id)
    worker_arn = values.get("WORKER_INSTANCE_PROFILE_ARN")
    if not worker_arn:
        worker_arn, created = instance_profile(iam, f"{cluster_name}-worker", bucket_policy(runs),
                                               tags=cost_tags(cluster_name))
    head_arn = values.get("HEAD_INSTANCE_PROFILE_ARN")
    if not head_arn:
        worker_role = profile_role(iam, worker_arn)
        head_policy = bucket_policy({**runs, "MLFLOW_ARTIFACTS_DESTINATION": values["MLFLOW_ARTIFACTS_DESTINATION"],
                                     "MLFLOW_DB_BACKUP": db_backup_uri(values)})
        head_policy.append({"Effect": "Allow", "Action": ["iam:PassRole"], "Resource": worker_role})
        if parameter:  # the database password, for the head's MLflow server alone
            account = session.client("sts", region_name=region).get_caller_identity()["Account"]
            head_policy.append({"Effect": "Allow", "Action": ["ssm:GetParameter"],
                                "Resource": f"arn:aws:ssm:{region}:{account}:parameter{parameter}"})
        head_policy += autoscaler_policy(cluster_name, group_id) + ebs_key_policy(values.get("EBS_KMS_KEY_ARN"))
        head_arn, made = instance_profile(iam, f"{cluster_name}-head", head_policy, tags=cost_tags(cluster_name))
        created = created or made
    return Access(group_id, head_arn, worker_arn, created, database_uri, parameter)


def ebs_key_policy(key_arn: str | None) -> list[dict]:
    """What launching an instance whose disks a customer-managed KMS key encrypts (an account's
    default EBS encryption) asks of the launcher on that key (AWS's "Required KMS key policy for use
    with encrypted volumes"): without it EC2 terminates each worker as it starts."""
    if not key_arn:
        return []
    return [{"Effect": "Allow", "Action": ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext",
                                           "kms:ReEncrypt*"], "Resource": key_arn},
            {"Effect": "Allow", "Action": ["kms:CreateGrant"], "Resource": key_arn,
             "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}}}]


def profile_role(iam, profile_arn: str) -> str:
    """The ARN of the role an instance profile holds: what the head may pass to the workers it
    launches. Read from IAM: a console-made pair's role has its own name and path."""
    roles = iam.get_instance_profile(InstanceProfileName=profile_arn.rsplit("/", 1)[-1])["InstanceProfile"]["Roles"]
    if not roles:
        raise ConfigError(f"instance profile {profile_arn} holds no role: add the workers' role to it")
    return roles[0]["Arn"]


def mlflow_db(values: dict[str, str]) -> str:
    """Where MLflow's record lives: ``rds`` (default: a managed PostgreSQL that up makes),
    ``own`` (MLFLOW_BACKEND_STORE_URI names yours) or ``head`` (SQLite on the head's disk, backed
    up by platform.cluster down only)."""
    if values.get("MLFLOW_BACKEND_STORE_URI"):
        return "own"
    return values.get("MLFLOW_DB") or "rds"


# What stays billed after down, in us-west-2's on-demand prices (per month of 730 hours): the
# database instance and its gp3 storage; automated backups up to the database's size are free.
DB_MONTHLY_USD = {"db.t4g.micro": 0.016 * 730}
DB_STORAGE_MONTHLY_USD_PER_GB = 0.115
SSM_IMAGE = "resolve:ssm:"  # an ImageId that names an SSM parameter holding the image's ID


def resolve_images(node_types: dict, region: str, session=None, pinned: dict[str, str] | None = None) -> dict[str, str]:
    """``{"resolve:ssm:NAME": ID}`` for every node type's ImageId that names an SSM parameter (AWS
    publishes its images' newest IDs per region that way): Ray's launcher wants the ID itself.
    A name ``pinned`` holds keeps its ID there, AWS unasked."""
    import boto3

    ssm = (session or boto3.session.Session(region_name=region)).client("ssm", region_name=region)
    found = {}
    for node in node_types.values():
        image = node["node_config"].get("ImageId", "")
        if image in (pinned or {}):
            found[image] = pinned[image]
        elif image.startswith(SSM_IMAGE) and image not in found:
            name = image[len(SSM_IMAGE):]
            try:
                found[image] = ssm.get_parameter(Name=name)["Parameter"]["Value"]
            except ssm.exceptions.ParameterNotFound:
                raise ConfigError(f"no image parameter {name} in {region}: name the image in cluster.env (GPU_IMAGE_ID="
                                  "ami-... for the GPU workers, UBUNTU_IMAGE_ID=ami-... for the head and CPU workers) "
                                  "or an image ID (ImageId: ami-...) in cluster.yaml") from None
    return found


def terminate_instances(cluster_name: str, region: str, session=None) -> list[str]:
    """Terminate every instance of ``cluster_name`` that is not already gone: running, or stopped
    by Ray's provider (cache_stopped_nodes: stopped nodes and their disks bill on), of this
    configuration or an older one. Returns their IDs, after AWS has them terminated."""
    import boto3
    from ray.autoscaler.tags import TAG_RAY_CLUSTER_NAME  # Ray's launcher tags every instance it makes so

    ec2 = (session or boto3.session.Session(region_name=region)).client("ec2", region_name=region)
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{TAG_RAY_CLUSTER_NAME}", "Values": [cluster_name]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    ids = [i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
        ec2.get_waiter("instance_terminated").wait(InstanceIds=ids, WaiterConfig={"Delay": 5, "MaxAttempts": 120})
    return ids


def kept_after_down(values: dict[str, str]) -> list[str]:
    """What ``down`` leaves billed, each with what it costs a month."""
    kept = []
    if mlflow_db(values) == "rds":
        monthly = DB_MONTHLY_USD[DB_INSTANCE_CLASS] + DB_STORAGE_GB * DB_STORAGE_MONTHLY_USD_PER_GB
        kept.append(f"MLflow's database {db_identifier(values['CLUSTER_NAME'])} (RDS {DB_INSTANCE_CLASS}, {DB_STORAGE_GB} GB): "
                    f"about ${monthly:.0f} a month; delete it in the RDS console (deletion protection is on) when its "
                    "runs are no longer wanted")
    buckets = sorted({s3_location(values[k], k)[0] for k in ("RUNS_URI", "MLFLOW_ARTIFACTS_DESTINATION") if values.get(k)})
    kept.append(f"the bucket(s) {', '.join(buckets)}: checkpoints, artifacts and backups, billed by S3 per GB stored "
                "(about $0.023 per GB a month)")
    return kept


def autoscaler_policy(cluster_name: str, group_id: str) -> list[dict]:
    """What Ray's autoscaler on the head does in EC2, on this cluster's instances only: launch them
    into the cluster's group with the cluster's tag (render puts it on every instance and disk),
    tag, start, stop and terminate instances that carry it (never moving the tag itself), and
    read (EC2's Describe actions have no resource scope). Code on the head (any ``ray job
    submit``) can touch nothing else in the account."""
    mine = {"StringEquals": {f"aws:ResourceTag/{COST_TAG}": cluster_name}}
    return [
        {"Effect": "Allow", "Action": ["ec2:Describe*"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"],
         "Condition": {"StringEquals": {f"aws:RequestTag/{COST_TAG}": cluster_name}}},
        {"Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [f"arn:aws:ec2:*:*:security-group/{group_id}", "arn:aws:ec2:*::image/*", "arn:aws:ec2:*:*:subnet/*",
                      "arn:aws:ec2:*:*:network-interface/*", "arn:aws:ec2:*:*:key-pair/*"]},
        {"Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": ["arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}},
        {"Effect": "Allow", "Action": ["ec2:CreateTags", "ec2:DeleteTags"], "Resource": "arn:aws:ec2:*:*:instance/*",
         "Condition": {**mine, "ForAllValues:StringNotEquals": {"aws:TagKeys": [COST_TAG]}}},
        {"Effect": "Allow", "Action": ["ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"],
         "Resource": "arn:aws:ec2:*:*:instance/*", "Condition": mine},
    ]


def read_password(parameter: str, region: str | None) -> str:
    import boto3

    ssm = boto3.client("ssm", region_name=region)
    return ssm.get_parameter(Name=parameter, WithDecryption=True)["Parameter"]["Value"]


def db_backup_uri(values: dict[str, str]) -> str:
    """Where the head's SQLite MLflow database is backed up: ``MLFLOW_DB_BACKUP``, else beside the
    artifacts (``s3://bucket/mlflow-artifacts`` -> ``s3://bucket/mlflow-db/mlflow.db``)."""
    if values.get("MLFLOW_DB_BACKUP"):
        return values["MLFLOW_DB_BACKUP"]
    bucket, prefix = s3_location(values["MLFLOW_ARTIFACTS_DESTINATION"], "MLFLOW_ARTIFACTS_DESTINATION")
    parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    return f"s3://{bucket}/{parent + '/' if parent else ''}mlflow-db/mlflow.db"


def settle(access: Access, seconds: float = 30.0) -> None:
    """A new role or instance profile is refused by EC2 for a few seconds after IAM made it: as long
    as Ray's own bootstrap waits when it makes them (15 s after the role, 15 s after the profile)."""
    if access.created:
        time.sleep(seconds)


def billed_hours(cluster_name: str, since_s: float, until_s: float | None = None) -> dict[str, float]:
    """What AWS bills for the cluster's instances over ``[since_s, until_s]``: each instance Ray's
    launcher tagged with the cluster's name, from its launch (``LaunchTime``, reset when a stopped
    instance starts again) to its stop or termination (the time in ``StateTransitionReason``) or
    now; by node type (``ray-user-node-type``). Terminated instances stay listed for about an hour."""
    import boto3
    from ray.autoscaler.tags import TAG_RAY_CLUSTER_NAME

    until_s = until_s or time.time()
    totals: dict[str, float] = {"billed_node_hours": 0.0}
    ec2 = boto3.client("ec2")
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{TAG_RAY_CLUSTER_NAME}", "Values": [cluster_name]}])
    for reservation in (r for page in pages for r in page["Reservations"]):
        for instance in reservation["Instances"]:
            start = instance["LaunchTime"].timestamp()
            end = until_s
            if instance["State"]["Name"] in ("stopping", "stopped", "shutting-down", "terminated"):
                # "User initiated (YYYY-MM-DD HH:MM:SS GMT)" (AWS's documented form; the emulator says UTC)
                when = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)",
                                 instance.get("StateTransitionReason", ""))
                if when:
                    end = datetime.datetime.strptime(when[1], "%Y-%m-%d %H:%M:%S").replace(
                        tzinfo=datetime.timezone.utc).timestamp()
            hours = max(0.0, min(end, until_s) - max(start, since_s)) / 3600
            kind = next((tag["Value"] for tag in instance.get("Tags", []) if tag["Key"] == "ray-user-node-type"), "other")
            totals["billed_node_hours"] += hours
            totals[f"billed_node_hours/{kind}"] = totals.get(f"billed_node_hours/{kind}", 0.0) + hours
    return totals
