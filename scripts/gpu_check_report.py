"""Helpers of scripts/gpu_check.sh: probe the machine, record steps, summarise.

    python scripts/gpu_check_report.py probe   --out DIR --env-sh FILE [--dry-run]
    python scripts/gpu_check_report.py record  --out DIR --name N --status S --seconds T
                                               --budget B --expected E [--note TEXT]
    python scripts/gpu_check_report.py junit   --out DIR --name N XML...
    python scripts/gpu_check_report.py summary --out DIR [--dry-run]

Every step leaves ``DIR/<name>.md`` and ``DIR/<name>.json`` (status, seconds,
the expected time on the GPU machine, a note, the tail of its log in
``DIR/logs/<name>.log`` and what the step itself wrote), and ``summary``
rewrites ``DIR/summary.md`` / ``summary.json`` from all of them, so a run that
was cut keeps what finished. Standard library only (this runs before the test
tools are installed), except ``probe``, which imports torch when it can.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

# ``slow``: a dry run's step that passed but ran past the time box sized for the
# GPU machine (time boxes bind only there; see scripts/gpu_check.sh).
STATUSES = ("pass", "slow", "fail", "timeout", "skipped")


def _run(cmd: list[str], timeout: float = 20) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except Exception as exc:  # missing tool, timeout
        return f"unavailable ({type(exc).__name__}: {exc})"


def _first_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _cuda_home(nvcc: str | None) -> tuple[str | None, str]:
    """Where the CUDA toolkit is, the way torch.utils.cpp_extension looks (and why)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and os.path.isdir(os.environ[var]):
            return os.environ[var], f"${var}"
    if nvcc:
        real = os.path.realpath(nvcc)
        # /usr/local/bin/nvcc may be a wrapper script: read the path it execs.
        try:
            with open(nvcc, errors="replace") as f:
                head = f.read(4096)
            if head.startswith("#!"):
                for tok in head.split():
                    if tok.endswith("/bin/nvcc") and os.path.isfile(tok):
                        real = tok
        except OSError:
            pass
        return os.path.dirname(os.path.dirname(real)), f"nvcc at {real}"
    if os.path.isdir("/usr/local/cuda"):
        return "/usr/local/cuda", "/usr/local/cuda"
    return None, "no nvcc on PATH, no $CUDA_HOME, no /usr/local/cuda"


def _find(roots: list[str], name: str) -> str | None:
    for root in roots:
        for sub in ("include", "targets/x86_64-linux/include", "lib64", "lib"):
            p = os.path.join(root, sub, name)
            if os.path.exists(p):
                return p
    return None


def cmd_probe(a: argparse.Namespace) -> int:
    """Describe the machine (env.json / env.md) and write shell exports for the build."""
    info: dict = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": a.dry_run,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_exe": sys.executable,
        "gxx": _run(["g++", "--version"]).splitlines()[0] if shutil.which("g++") else "missing",
        "cmake": _run(["cmake", "--version"]).splitlines()[0]
        if shutil.which("cmake")
        else "missing",
        "ninja": _run(["ninja", "--version"]) if shutil.which("ninja") else "missing",
        "nvidia_smi": _run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        )
        if shutil.which("nvidia-smi")
        else "missing",
    }
    nvcc = shutil.which("nvcc")
    exports: dict[str, str] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        # The pip CUDA wheels (nvidia/cu13/...) may carry nvcc and the headers ATen includes.
        try:
            import nvidia  # type: ignore[import-not-found]

            roots = [os.path.join(p, sub) for p in nvidia.__path__ for sub in ("cu13", "cu12")]
            info["nvidia_wheel_roots"] = [r for r in roots if os.path.isdir(r)]
        except ImportError:
            info["nvidia_wheel_roots"] = []
        if nvcc is None:
            for r in info["nvidia_wheel_roots"]:
                if os.path.isfile(os.path.join(r, "bin", "nvcc")):
                    nvcc = os.path.join(r, "bin", "nvcc")
                    exports["PATH"] = f"{os.path.dirname(nvcc)}:$PATH"
        try:
            sys.path.insert(0, os.getcwd())
            from torch_replay._planning.kernel_timing import cupti_status

            ok, why = cupti_status()
            info["cupti"] = {"available": ok, "why": why}
        except Exception as exc:
            info["cupti"] = {"available": False, "why": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:
        info["torch"] = f"not importable ({type(exc).__name__}: {exc})"
        info["nvidia_wheel_roots"] = []
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:
        info["triton"] = f"not importable ({type(exc).__name__})"
    info["nvcc"] = nvcc or "missing"
    info["nvcc_version"] = _first_line(_run([nvcc, "--version"])) if nvcc else "missing"
    home, why = _cuda_home(nvcc)
    info["cuda_home"] = home
    info["cuda_home_from"] = why
    roots = ([home] if home else []) + info["nvidia_wheel_roots"]
    found = {
        n: _find(roots, n)
        for n in ("cuda_runtime.h", "cublas_v2.h", "cusparse.h", "cupti.h", "libcudart.so")
    }
    found["libcupti"] = next(
        (
            p
            for r in roots
            for p in glob.glob(os.path.join(r, "**", "libcupti.so*"), recursive=True)
        ),
        None,
    )
    info["found"] = found
    if home and not os.environ.get("CUDA_HOME"):
        exports["CUDA_HOME"] = home
    # ATen's CUDA headers include cuBLAS/cuSPARSE headers that may live in the wheels.
    incs = sorted(
        {
            os.path.dirname(p)
            for p in (found["cublas_v2.h"], found["cusparse.h"], found["cuda_runtime.h"])
            if p
        }
    )
    if incs:
        exports["CPATH"] = ":".join(incs) + "${CPATH:+:$CPATH}"
    # A toolkit assembled from wheels may ship libcudart.so.13 but no libcudart.so.
    if home and not found["libcudart.so"]:
        real = next(
            (
                p
                for r in roots
                for p in sorted(glob.glob(os.path.join(r, "lib*", "libcudart.so.*")))
            ),
            None,
        )
        if real:
            shim = os.path.join(a.work, "libshim")
            os.makedirs(shim, exist_ok=True)
            link = os.path.join(shim, "libcudart.so")
            if not os.path.lexists(link):
                os.symlink(real, link)
            exports["LIBRARY_PATH"] = f"{shim}${{LIBRARY_PATH:+:$LIBRARY_PATH}}"
            info["libcudart_shim"] = f"{link} -> {real}"
    info["exports"] = exports
    with open(a.env_sh, "w") as f:
        for k, v in exports.items():
            f.write(f'export {k}="{v}"\n')
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(info, f, indent=1)
    with open(os.path.join(a.out, "env.md"), "w") as f:
        f.write("# Machine\n\n| key | value |\n|---|---|\n")
        for k, v in info.items():
            f.write(f"| {k} | `{json.dumps(v) if not isinstance(v, str) else v}` |\n")
    print(json.dumps(info, indent=1))
    if a.note_file:
        with open(a.note_file, "w") as f:
            f.write(
                f"torch {info.get('torch')} (CUDA {info.get('torch_cuda')}), GPU "
                f"{info.get('gpu', 'none')} {info.get('capability', '')}, nvcc "
                f"{info['nvcc_version']}, CUDA_HOME {home} ({why}), CUPTI: "
                f"{info.get('cupti', {}).get('why')}\n"
            )
    if not a.dry_run and not info.get("cuda_available"):
        print(
            "error: torch sees no CUDA device; on a machine without a GPU run "
            "`bash scripts/gpu_check.sh --dry-run`",
            file=sys.stderr,
        )
        return 1
    return 0


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def cmd_record(a: argparse.Namespace) -> int:
    """Write <name>.json / <name>.md for one finished step."""
    assert a.status in STATUSES, a.status
    log = os.path.join(a.out, "logs", f"{a.name}.log")
    produced = sorted(
        os.path.basename(p)
        for p in glob.glob(os.path.join(a.out, f"{a.name}*"))
        if not p.endswith((f"{a.name}.json", f"{a.name}.md"))
    )
    rec = {
        "name": a.name,
        "status": a.status,
        "seconds": round(a.seconds, 1),
        "budget_s": int(a.budget) if a.budget.is_integer() else a.budget,
        "expected_on_gpu": a.expected,
        "note": a.note,
        "log": os.path.relpath(log, a.out),
        "files": produced,
    }
    with open(os.path.join(a.out, f"{a.name}.json"), "w") as f:
        json.dump(rec, f, indent=1)
    tail = _tail(log)
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write(
            f"# {a.name}: {a.status}\n\n{a.note}\n\n"
            f"{rec['seconds']} s (budget {rec['budget_s']} s; expected on the GPU machine: "
            f"{a.expected}). Files: {', '.join(produced) or '-'}.\n\n"
            f"Last lines of `{rec['log']}`:\n\n```\n{tail}```\n"
        )
    return 0


def cmd_junit(a: argparse.Namespace) -> int:
    """Summarise pytest JUnit XML files into <name>_tests.md / .json."""
    cases = []
    for path in a.xml:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            cases.append({"id": path, "outcome": "error", "message": f"no report: {exc}"})
            continue
        for tc in root.iter("testcase"):
            outcome, message = "passed", ""
            for kind in ("failure", "error", "skipped"):
                el = tc.find(kind)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    message = (el.get("message") or el.text or "")[:500]
            cases.append(
                {
                    "id": f"{tc.get('classname', '')}::{tc.get('name', '')}",
                    "outcome": outcome,
                    "seconds": float(tc.get("time") or 0),
                    "message": message,
                }
            )
    counts = {
        k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")
    }
    with open(os.path.join(a.out, f"{a.name}_tests.json"), "w") as f:
        json.dump({"counts": counts, "cases": cases}, f, indent=1)
    with open(os.path.join(a.out, f"{a.name}_tests.md"), "w") as f:
        f.write(f"# {a.name}: pytest cases\n\n{json.dumps(counts)}\n\n")
        f.write("| test | outcome | s | message |\n|---|---|---|---|\n")
        for c in cases:
            msg = c["message"].replace("|", "/").replace("\n", " ")[:200]
            f.write(f"| {c['id']} | {c['outcome']} | {c.get('seconds', 0):.2f} | {msg} |\n")
    print(json.dumps(counts))
    return 0 if counts["failed"] == counts["error"] == 0 and cases else 1


def cmd_summary(a: argparse.Namespace) -> int:
    """summary.md / summary.json from every recorded step."""
    steps = []
    for name in a.order.split(","):
        p = os.path.join(a.out, f"{name}.json")
        if os.path.exists(p):
            with open(p) as f:
                steps.append(json.load(f))
        else:
            steps.append({"name": name, "status": "not run", "seconds": 0, "note": "not reached"})
    env = {}
    if os.path.exists(os.path.join(a.out, "env.json")):
        with open(os.path.join(a.out, "env.json")) as f:
            env = json.load(f)
    total = sum(s.get("seconds", 0) for s in steps)
    bad = [s["name"] for s in steps if s["status"] in ("fail", "timeout")]
    doc = {
        "dry_run": a.dry_run,
        "ok": not bad,
        "failed": bad,
        "seconds": round(total, 1),
        "machine": {k: env.get(k) for k in ("gpu", "torch", "torch_cuda", "nvcc_version", "cpus")},
        "steps": steps,
    }
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1)
    mode = "dry run (no GPU)" if a.dry_run else "GPU run"
    lines = [
        f"# GPU check: {mode}: {'OK' if not bad else 'FAILED: ' + ', '.join(bad)}",
        "",
        f"Machine: {env.get('gpu') or 'no GPU'}; torch {env.get('torch')} (CUDA "
        f"{env.get('torch_cuda')}); nvcc {env.get('nvcc_version')}; {env.get('cpus')} CPUs. "
        f"Steps took {total:.0f} s.",
        "",
        "| step | status | s | expected on the GPU machine | note |",
        "|---|---|---|---|---|",
    ]
    for s in steps:
        note = str(s.get("note", "")).replace("|", "/").replace("\n", " ")
        lines.append(
            f"| [{s['name']}]({s['name']}.md) | {s['status']} | {s.get('seconds', 0)} "
            f"| {s.get('expected_on_gpu', '-')} | {note} |"
        )
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not bad else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe")
    pr.add_argument("--out", required=True)
    pr.add_argument("--work", required=True, help="scratch folder (library shims)")
    pr.add_argument("--env-sh", required=True)
    pr.add_argument("--note-file", help="where to write a one-line summary")
    pr.add_argument("--dry-run", action="store_true")
    rc = sub.add_parser("record")
    rc.add_argument("--out", required=True)
    rc.add_argument("--name", required=True)
    rc.add_argument("--status", required=True, choices=STATUSES)
    rc.add_argument("--seconds", type=float, required=True)
    rc.add_argument("--budget", type=float, required=True)
    rc.add_argument("--expected", default="-")
    rc.add_argument("--note", default="")
    ju = sub.add_parser("junit")
    ju.add_argument("--out", required=True)
    ju.add_argument("--name", required=True)
    ju.add_argument("xml", nargs="+")
    su = sub.add_parser("summary")
    su.add_argument("--out", required=True)
    su.add_argument("--order", required=True, help="step names, comma-separated")
    su.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    return {"probe": cmd_probe, "record": cmd_record, "junit": cmd_junit, "summary": cmd_summary}[
        a.cmd
    ](a)


if __name__ == "__main__":
    raise SystemExit(main())
