"""The result table (row, ours, Python, ratio, unit), its number format, and the machine's
description.
"""
import os
import platform
import subprocess


# ---------------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------------
def pct(vals, q):
    s = sorted(vals)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3f}"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, ours, python, unit, better="lower", note=""):
        ratio = None
        if isinstance(ours, (int, float)) and isinstance(python, (int, float)) and ours and python:
            ratio = python / ours if better == "lower" else ours / python
        self.rows.append({"row": name, "ours": ours, "python": python, "ratio": ratio,
                          "unit": unit, "better": better, "note": note})

    def render(self):
        head = ("row", "ours", "Python 1.7.5", "ratio", "unit")
        lines = [(r["row"], fmt(r["ours"]), fmt(r["python"]),
                  (fmt(r["ratio"]) + "x") if r["ratio"] else "-", r["unit"]) for r in self.rows]
        w = [max(len(x[i]) for x in lines + [head]) for i in range(5)]
        out = ["  ".join(h.ljust(w[i]) if i in (0, 4) else h.rjust(w[i])
                         for i, h in enumerate(head)), "  ".join("-" * x for x in w)]
        for x in lines:
            out.append("  ".join(c.ljust(w[i]) if i in (0, 4) else c.rjust(w[i])
                                 for i, c in enumerate(x)))
        return "\n".join(out)


def machine():
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / (1 << 20)
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    docker = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "ram_gib": round(mem, 1), "kernel": platform.release(),
            "cpu": model, "docker": docker}
