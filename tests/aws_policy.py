"""AWS's rules for an identity policy, applied to S3 requests an emulator recorded.

moto's IAM engine checks actions and resources but ignores ``Condition`` and names HeadBucket's
action ``s3:HeadBucket`` (AWS has none): it lets a policy pass that AWS refuses. Here each
recorded request is mapped to what AWS authorises it with (Amazon S3's "Actions, resources, and
condition keys" and "Required permissions for Amazon S3 API operations"), then judged by the
evaluation logic of IAM's "Policy evaluation logic" for a single identity policy:

- a statement applies when its ``Action`` and ``Resource`` match (``*`` and ``?`` wildcards;
  actions case-insensitive) and every condition holds;
- a condition on a key the request does not carry does not hold, except for the ``...IfExists``
  operators (and ``Null``, which asks exactly that);
- an explicit Deny wins; without an Allow the answer is deny.

Only the condition operators the platform's policies could use are known; any other fails loudly.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True)
class Request:
    """What AWS authorises: one action on one resource, with the request's condition keys."""
    operation: str
    action: str
    resource: str
    context: dict = field(default_factory=dict, hash=False)

    def __str__(self) -> str:
        keys = "".join(f" {k}={v!r}" for k, v in self.context.items())
        return f"{self.operation} {self.resource} ({self.action}{keys})"


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcard match: ``*`` any run of characters, ``?`` one; nothing else special."""
    return re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                        value, flags=re.S) is not None


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


OPERATORS = {
    "StringEquals": lambda want, have: have == want,
    "StringNotEquals": lambda want, have: have != want,
    "StringLike": lambda want, have: _like(want, have),
    "StringNotLike": lambda want, have: not _like(want, have),
    "ArnEquals": lambda want, have: have == want,
    "ArnLike": lambda want, have: _like(want, have),
    "Bool": lambda want, have: str(have).lower() == str(want).lower(),
}


def _condition_holds(conditions: dict, context: dict) -> bool:
    for operator, tests in conditions.items():
        if operator.startswith("ForAllValues:"):  # every value the request carries (none: holds)
            base = operator.split(":", 1)[1]
            for key, wanted in tests.items():
                if any(not _condition_holds({base: {key: wanted}}, {key: value}) for value in _as_list(context.get(key, []))):
                    return False
            continue
        if_exists = operator.endswith("IfExists")
        base = operator.removesuffix("IfExists")
        for key, wanted in tests.items():
            present = key in context
            if base == "Null":
                if (str(wanted).lower() == "true") == present:
                    return False
                continue
            if base not in OPERATORS:
                raise NotImplementedError(f"condition operator {operator} is not evaluated here")
            if not present:
                if if_exists:
                    continue
                return False
            negated = base.startswith(("StringNot", "ArnNot"))
            values = _as_list(context[key])
            matches = [any(OPERATORS[base](w, v) for w in _as_list(wanted)) for v in values]
            if not (all(matches) if negated else any(matches)):
                return False
    return True


def _applies(statement: dict, request: Request) -> bool:
    actions = _as_list(statement.get("Action", []))
    resources = _as_list(statement.get("Resource", []))
    if not any(_like(a.lower(), request.action.lower()) for a in actions):
        return False
    if not any(_like(r, request.resource) for r in resources):
        return False
    return _condition_holds(statement.get("Condition", {}), request.context)


def allowed(statements: list[dict], request: Request) -> bool:
    """AWS's answer for ``request`` under an identity policy of ``statements``."""
    applying = [s for s in statements if _applies(s, request)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    return any(s["Effect"] == "Allow" for s in applying)


def s3_requests(entry: dict) -> list[Request]:
    """What AWS authorises one recorded S3 REST request with (path-style addressing), one
    ``Request`` per permission it needs (a copy reads its source and writes its target; a
    multi-object delete deletes each key)."""
    url = urlsplit(entry["url"])
    path = unquote(url.path)
    query = parse_qs(url.query, keep_blank_values=True)
    method = entry["method"]
    bucket, _, key = path.lstrip("/").partition("/")
    bucket_arn = f"arn:aws:s3:::{bucket}"
    object_arn = f"{bucket_arn}/{key}"
    headers = {k.lower(): v for k, v in entry.get("headers", {}).items()}
    if not bucket:
        return [Request("ListBuckets", "s3:ListAllMyBuckets", "*")]
    if not key:
        if method == "HEAD":
            return [Request("HeadBucket", "s3:ListBucket", bucket_arn)]
        if method == "GET":
            for sub, (operation, action) in {"location": ("GetBucketLocation", "s3:GetBucketLocation"),
                                             "uploads": ("ListMultipartUploads", "s3:ListBucketMultipartUploads"),
                                             "versions": ("ListObjectVersions", "s3:ListBucketVersions"),
                                             "versioning": ("GetBucketVersioning", "s3:GetBucketVersioning"),
                                             "policy": ("GetBucketPolicy", "s3:GetBucketPolicy"),
                                             "acl": ("GetBucketAcl", "s3:GetBucketAcl")}.items():
                if sub in query:
                    return [Request(operation, action, bucket_arn)]
            context = {f"s3:{name}": query[param][0] for name, param in
                       (("prefix", "prefix"), ("delimiter", "delimiter"), ("max-keys", "max-keys")) if param in query}
            operation = "ListObjectsV2" if query.get("list-type") == ["2"] else "ListObjects"
            return [Request(operation, "s3:ListBucket", bucket_arn, context)]
        if method == "POST" and "delete" in query:
            body = entry.get("body") or ""
            text = base64.b64decode(body).decode() if entry.get("body_encoded") else body
            keys = [unquote(k) for k in re.findall(r"<Key>(.*?)</Key>", text, flags=re.S)]
            return [Request("DeleteObjects", "s3:DeleteObject", f"{bucket_arn}/{k}") for k in keys]
        if method == "PUT" and not query:
            return [Request("CreateBucket", "s3:CreateBucket", bucket_arn)]
        raise NotImplementedError(f"bucket request not mapped: {method} {entry['url']}")
    if method in ("GET", "HEAD"):
        if "uploadId" in query:
            return [Request("ListParts", "s3:ListMultipartUploadParts", object_arn)]
        if "tagging" in query:
            return [Request("GetObjectTagging", "s3:GetObjectTagging", object_arn)]
        return [Request("HeadObject" if method == "HEAD" else "GetObject", "s3:GetObject", object_arn)]
    if method == "PUT":
        if "tagging" in query:
            return [Request("PutObjectTagging", "s3:PutObjectTagging", object_arn)]
        wanted = [Request("UploadPart" if "partNumber" in query else "PutObject", "s3:PutObject", object_arn)]
        source = headers.get("x-amz-copy-source")
        if source:
            wanted.append(Request("CopyObject(source)", "s3:GetObject", "arn:aws:s3:::" + unquote(source).lstrip("/").split("?")[0]))
        return wanted
    if method == "POST":
        return [Request("CompleteMultipartUpload" if "uploadId" in query else "CreateMultipartUpload", "s3:PutObject",
                        object_arn)]
    if method == "DELETE":
        if "uploadId" in query:
            return [Request("AbortMultipartUpload", "s3:AbortMultipartUpload", object_arn)]
        return [Request("DeleteObject", "s3:DeleteObject", object_arn)]
    raise NotImplementedError(f"object request not mapped: {method} {entry['url']}")


def recorded(lines: str) -> list[dict]:
    """moto's recording (``/moto-api/recorder/download-recording``): one JSON request a line."""
    return [json.loads(line) for line in lines.splitlines() if line.strip()]


def is_s3(entry: dict) -> bool:
    """Whether a recorded request went to S3 (by its signature's service), not EC2 or IAM."""
    auth = {k.lower(): v for k, v in entry.get("headers", {}).items()}.get("authorization", "")
    return "/s3/aws4_request" in auth
