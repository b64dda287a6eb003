"""Negative tests of the Terraform checker (entry point: tests/terraform/negative.sh).

Each case copies terraform/ (the module under test and the local modules it calls), breaks the
copy of one module in one way, runs the checker on it and
asserts that it fails (exit 1) with the expected finding: its kind and Terraform's (or
checkov's, trivy's) own message. A clean copy must pass. Exit 1 if any broken copy passes or
fails differently, 2 if the checker could not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
TERRAFORM = REPO / "terraform"
MODULE = TERRAFORM / "aws-batch"
STEPS = ("fmt", "validate", "test", "checkov", "trivy")


@dataclass
class Case:
    name: str
    file: str  # relative to the module
    old: str  # text to replace ("" with `append`)
    new: str
    kind: str  # expected finding kind
    message: str  # regex the finding's message must match
    steps: tuple = STEPS  # checker steps to run (the others are skipped, for speed)
    target: str = "."  # directory checked, relative to the module
    append: bool = False
    expect_exit: int = 1
    module: str = "aws-batch"  # the module under terraform/ that is broken and checked


TF = ("fmt", "validate")
# `terraform test` validates the configuration itself: no separate validate step.
TF_TEST = ("fmt", "test")

CASES = [
    Case("clean copy passes", "main.tf", "", "", "", "", STEPS, append=True, expect_exit=0),
    Case("misspelled argument", "batch.tf", "  priority = 1\n", "  priorty  = 1\n",
         "validate", r'Unsupported argument: An argument named "priorty" is not expected here\. '
                     r'Did you mean "priority"\?', TF),
    Case("missing required argument", "batch.tf", '  state    = "ENABLED"\n', "",
         "validate", r'Missing required argument: The argument "state" is required', TF),
    Case("misspelled nested argument", "batch.tf", "    max_vcpus           = local.max_vcpus\n",
         "    max_vcpu            = local.max_vcpus\n",
         "validate", r'Unsupported argument: An argument named "max_vcpu" is not expected here\. '
                     r'Did you mean "max_vcpus"\?', TF),
    Case("unsupported block type", "batch.tf", "    ec2_configuration {\n", "    ec2_config {\n",
         "validate", r'Unsupported block type: Blocks of type "ec2_config" are not expected here', TF),
    Case("wrong value type", "batch.tf", "    max_vcpus           = local.max_vcpus\n",
         '    max_vcpus           = "lots"\n',
         "validate", r'Incorrect attribute value type: Inappropriate value for attribute "max_vcpus": '
                     r'a number is required', TF),
    Case("unknown resource type", "efs.tf", 'resource "aws_efs_mount_target" "work" {',
         'resource "aws_efs_mounttarget" "work" {',
         "validate", r'Invalid resource type: The provider hashicorp/aws does not support resource '
                     r'type "aws_efs_mounttarget"\. Did you mean "aws_efs_mount_target"\?', TF),
    Case("undeclared variable", "main.tf", '"--worker-work-dir-prefix", var.shared_work_dir,',
         '"--worker-work-dir-prefix", var.shared_workdir,',
         "validate", r'Reference to undeclared input variable: An input variable with the name '
                     r'"shared_workdir" has not been declared', TF),
    Case("attribute that does not exist", "outputs.tf", "value       = aws_efs_file_system.work.id\n",
         "value       = aws_efs_file_system.work.file_system_idd\n",
         "validate", r'Unsupported attribute: This object has no argument, nested block, or exported '
                     r'attribute named "file_system_idd"', TF),
    Case("ephemeral value into a stored argument", "examples/basic/main.tf",
         "  secret_string_wo         = var.codalab_password\n",
         "  secret_string            = var.codalab_password\n",
         "validate", r"Invalid use of ephemeral value: Ephemeral values are not valid for "
                     r'"secret_string"', TF, target="examples/basic"),
    Case("not formatted", "outputs.tf", '  value       = local.manager_command\n',
         '  value = local.manager_command\n', "fmt", r"not in canonical format", TF),
    Case("syntax error", "main.tf", "", 'resource "aws_s3_bucket" "x" {{\n', "syntax",
         r"(Invalid|Argument or block definition required|Unclosed)", TF, append=True),
    Case("wrong manager_command expectation", "tests/manager_command.tftest.hcl",
         "--min-workers 0 --max-workers 10 ", "--min-workers 0 --max-workers 9 ",
         "test", r"Test assertion failed: unexpected manager command: cl-worker-manager --server "
                 r"https://worksheets\.example\.org --min-workers 0 --max-workers 10 ", TF_TEST),
    Case("a manager that may tag any Batch job", "iam.tf",
         '    actions = ["batch:SubmitJob"]\n', '    actions = ["batch:SubmitJob", "batch:TagResource"]\n',
         "test", r"Test assertion failed: batch:TagResource must be conditioned on this manager's "
                 r"tag value and its own tag keys", TF_TEST),
    Case("unencrypted file system", "efs.tf", "  encrypted        = true\n", "  encrypted        = false\n",
         "checkov", r"CKV_AWS_42 Ensure EFS is securely encrypted \((module\.\S+\.)?aws_efs_file_system\.work\)",
         ("checkov",)),
    Case("unencrypted file system (trivy)", "efs.tf", "  encrypted        = true\n",
         "  encrypted        = false\n",
         "trivy", r"AWS-0037 EFS Encryption has not been enabled", ("trivy",)),
    Case("security group open to the world", "network.tf", "", '''
resource "aws_security_group" "debug" {
  name        = "debug"
  description = "debugging access"
  vpc_id      = var.vpc_id

  ingress {
    description = "ssh"
    from_port   = 22
    to_port     = 22
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}
''', "checkov", r"CKV_AWS_24 Ensure no security groups allow ingress from 0\.0\.0\.0:0 to port 22",
         ("checkov",), append=True),
    Case("security group open to the world (trivy)", "network.tf", "", '''
resource "aws_vpc_security_group_ingress_rule" "debug" {
  security_group_id = aws_security_group.workers.id
  description       = "ssh"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = "0.0.0.0/0"
}
''', "trivy", r"AWS-0107 .*(ingress|public internet)", ("trivy",), append=True),
    Case("public S3 bucket", "main.tf", "", '''
resource "aws_s3_bucket" "results" {
  bucket = "${var.name}-results"
}

resource "aws_s3_bucket_public_access_block" "results" {
  bucket                  = aws_s3_bucket.results.id
  block_public_acls       = false
  block_public_policy     = false
  ignore_public_acls      = false
  restrict_public_buckets = false
}
''', "checkov", r"CKV_AWS_5[3-6] Ensure S3 bucket has (block public|ignore public|RestrictPublicBuckets)",
         ("checkov",), append=True),
    # --- the other modules: each fails on a broken copy, with Terraform's or a scanner's message.
    Case("kubernetes: clean copy passes", "main.tf", "", "", "", "", STEPS, append=True,
         expect_exit=0, module="kubernetes"),
    Case("kubernetes: misspelled argument", "manager.tf",
         "        service_account_name            = ",
         "        service_acount_name             = ",
         "validate", r'Unsupported argument: An argument named "service_acount_name" is not expected '
                     r'here\. Did you mean "service_account_name"\?', TF, module="kubernetes"),
    Case("kubernetes: wrong manager_command expectation", "tests/manager_command.tftest.hcl",
         "--password-secret codalab-worker-credentials --worker-image codalab/worker:0.1.0",
         "--password-secret codalab-credentials --worker-image codalab/worker:0.1.0",
         "test", r"Test assertion failed: unexpected manager command: cl-worker-manager ", TF_TEST,
         module="kubernetes"),
    Case("kubernetes: managers without the lease", "main.tf",
         '    ["--lease", "kubernetes:${local.namespace}/${var.lease_name}"],\n', "",
         "test", r"Test assertion failed: the managers must share the Lease cl-worker-manager",
         TF_TEST, module="kubernetes"),
    Case("kubernetes: the manager's Role without the lease's create", "rbac.tf",
         '    { api_groups = ["coordination.k8s.io"], resources = ["leases"], verbs = ["create"], resource_names = [] },\n',
         "", "test", r"Test assertion failed: the manager's Role must grant exactly its calls", TF_TEST,
         module="kubernetes"),
    Case("kubernetes: privileged manager container", "manager.tf",
         "            privileged                 = false\n",
         "            privileged                 = true\n",
         "checkov", r"CKV_K8S_16 Do not admit privileged containers", ("checkov",),
         module="kubernetes"),
    Case("gke: missing required argument", "main.tf",
         "  tier                        = var.filestore_tier\n", "",
         "validate", r'Missing required argument: The argument "tier" is required', TF, module="gke"),
    Case("gke: legacy ABAC", "main.tf", "  deletion_protection      = var.deletion_protection\n",
         "  deletion_protection      = var.deletion_protection\n  enable_legacy_abac       = true\n",
         "checkov", r"CKV_GCP_7 Ensure Legacy Authorization is set to Disabled", ("checkov",),
         module="gke"),
    Case("azure-batch: undeclared variable", "main.tf",
         "  address_prefixes     = [cidrsubnet(var.address_space, 2, 0)]",
         "  address_prefixes     = [cidrsubnet(var.address_spaces, 2, 0)]",
         "validate", r'Reference to undeclared input variable: An input variable with the name '
                     r'"address_spaces" has not been declared', TF, module="azure-batch"),
    Case("azure-batch: public blob container", "storage.tf",
         '  container_access_type = "private"', '  container_access_type = "blob"',
         "checkov", r"CKV_AZURE_34 Ensure that 'Public access level' is set to Private for blob containers",
         ("checkov",), module="azure-batch"),
    Case("azure-batch: SSH open to the internet", "main.tf", "", '''
resource "azurerm_network_security_rule" "debug" {
  name                        = "ssh-from-anywhere"
  resource_group_name         = azurerm_resource_group.this.name
  network_security_group_name = azurerm_network_security_group.manager.name
  priority                    = 110
  direction                   = "Inbound"
  access                      = "Allow"
  protocol                    = "Tcp"
  source_port_range           = "*"
  destination_port_range      = "22"
  source_address_prefix       = "*"
  destination_address_prefix  = "*"
}
''', "checkov", r"CKV_AZURE_10 Ensure that SSH access is restricted from the internet",
         ("checkov",), append=True, module="azure-batch"),
]


# The deployed installations' isolation (NFS, metadata, network, roles), one file per module:
# negative_isolation_<module>.py defines `cases(Case, TF, TF_TEST)` returning its broken copies.
def _isolation_cases() -> list:
    import importlib.util
    out = []
    for f in sorted(HERE.glob("negative_isolation_*.py")):
        spec = importlib.util.spec_from_file_location(f.stem, f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out += mod.cases(Case, TF, TF_TEST)
    return out


CASES += _isolation_cases()


def test_files_holding(module: Path, message: str) -> list[str]:
    """The module's test files whose text holds the literal start of an expected
    "Test assertion failed: <error_message>" (up to the first regex metacharacter)."""
    m = re.search(r"Test assertion failed: (.*)", message)
    if not m:
        return []
    literal, rx, i = "", m.group(1), 0
    while i < len(rx):
        ch = rx[i]
        if ch == "\\":
            if i + 1 >= len(rx) or rx[i + 1].isalnum():
                break  # a class (\d, \S...) or a dangling backslash
            literal += rx[i + 1]
            i += 2
            continue
        if ch in ".^$*+?()[]{}|":
            break
        literal += ch
        i += 1
    if len(literal) < 12:
        return []
    return sorted(str(f.relative_to(module)) for f in module.glob("tests/*.tftest.hcl")
                  if literal in f.read_text())


def run_case(c: Case, tmp: Path, check: list[str]) -> tuple[bool, str]:
    top = tmp / re.sub(r"\W+", "-", c.name).strip("-")
    shutil.copytree(TERRAFORM, top, ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl"))
    d = top / c.module
    f = d / c.file
    text = f.read_text()
    if c.append:
        text += c.new
    else:
        if c.old not in text:
            return False, f"harness: {c.file} no longer contains {c.old!r}; update the case"
        text = text.replace(c.old, c.new, 1)
    f.write_text(text)
    env = dict(os.environ, TFCHECK_SKIP=",".join(s for s in STEPS if s not in c.steps))
    if c.kind == "test":
        # Only the test file that holds the expected assertion (a module's other test files
        # would pass and cost as much again).
        holders = test_files_holding(d, c.message)
        if len(holders) == 1:
            env["TFCHECK_TEST_FILTER"] = holders[0]
    t0 = time.time()
    p = subprocess.run(check + [str(d / c.target)], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=1200)
    took = time.time() - t0
    findings = [line for line in p.stdout.splitlines() if line.startswith("FAIL [")]
    if p.returncode == 2:
        return False, f"checker could not run: {p.stdout.strip()[-400:]} {p.stderr.strip()[-400:]}"
    if p.returncode != c.expect_exit:
        got = "\n      ".join(findings) or "(no finding)"
        return False, f"exit {p.returncode}, expected {c.expect_exit} ({took:.0f} s); findings:\n      {got}"
    if c.expect_exit == 0:
        return True, f"exit 0, no finding ({took:.0f} s)"
    rx = re.compile(r"^FAIL \[" + re.escape(c.kind) + r"\] \S+: .*" + c.message)
    hit = [line for line in findings if rx.search(line)]
    if not hit:
        got = "\n      ".join(findings) or "(no finding)"
        return False, f"no [{c.kind}] finding matching /{c.message}/; findings:\n      {got}"
    return True, f"{hit[0]} ({took:.0f} s)"


def main() -> int:
    if not MODULE.is_dir():
        print(f"ERROR negative: {MODULE} missing")
        print("negative: could not run")
        return 2
    check = [sys.executable, str(HERE / "tfcheck.py"), "check"]
    # Install the tools and build the schema once, before the cases run in parallel.
    warm = subprocess.run([sys.executable, str(HERE / "tfcheck.py"), "setup", "--provider", "aws",
                           "--provider", "azurerm", "--provider", "kubernetes", "--provider", "google"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if warm.returncode != 0:
        print(f"ERROR negative: checker setup failed: {warm.stdout.strip()} {warm.stderr.strip()[-600:]}")
        print("negative: could not run")
        return 2
    only = os.environ.get("NEGATIVE_ONLY")
    cases = [c for c in CASES if not only or re.search(only, c.name)]
    passed = failed = 0
    harness_error = False
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tfcheck-negative-") as tmp:
        jobs = int(os.environ.get("NEGATIVE_JOBS", "2"))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [(c, pool.submit(run_case, c, Path(tmp), check)) for c in cases]
            for c, fut in futures:
                ok, detail = fut.result()
                if detail.startswith(("harness:", "checker could not run")):
                    harness_error = True
                if ok:
                    passed += 1
                    print(f"PASS {c.name}: {detail}", flush=True)
                else:
                    failed += 1
                    print(f"FAIL {c.name}: {detail}", flush=True)
    print(f"({len(cases)} cases in {time.time() - t0:.0f} s)")
    print(f"negative: {passed} passed, {failed} failed")
    if failed and harness_error and passed == 0:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
