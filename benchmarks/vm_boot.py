"""Boot to the first instruction of the command under ``--isolation vm``.

    python benchmarks/vm_boot.py [--accel tcg|kvm] [--runs N] [--out FILE]

Starts ``pipguard run --isolation vm --vm-accel ACCEL -- sh -c 'cat /proc/uptime; echo go'``
N times, one after the other, and reports per run:

- ``to_command``: seconds from spawning pipguard to the command's first
  output line on this side (pipguard's own start, the plan, QEMU, firmware,
  the guest kernel, its init, the 9p mounts, the guest's pipguard confining
  itself, the exec): the figure issue 17 sets a target for (<= 1.5 s with KVM);
- ``guest_uptime``: the guest kernel's uptime when the command ran (the part
  of ``to_command`` inside the guest: kernel, init, mounts, the guest's pipguard);
- ``total``: to pipguard's exit (the guest powering off, the report).

Then the medians, the load average before and after and the host, as one
JSON line (and as a file with ``--out``). Needs what ``pipguard doctor`` lists
under vm.*; kvm needs a KVM that works (this machine's does not: TCG only).
Run it on a quiet machine: TCG is CPU-bound, and a loaded 2-CPU host doubles it.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = ["sh", "-c", "cat /proc/uptime; echo go"]


def once(accel: str) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pipguard", "run", "--isolation", "vm",
                                 "--vm-accel", accel, "--", *COMMAND],
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first = uptime = None
        for line in proc.stdout:
            if first is None:
                first = time.monotonic() - started
            words = line.split()
            if uptime is None and len(words) == 2 and words[0].replace(b".", b"").isdigit():
                uptime = float(words[0])
        proc.wait()
        return {"accel": accel, "to_command": round(first, 2) if first else None,
                "guest_uptime": uptime, "total": round(time.monotonic() - started, 2),
                "status": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accel", default="tcg", choices=("tcg", "kvm"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", metavar="FILE", help="also write the summary and the runs here (JSON)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = [once(args.accel) for _ in range(args.runs)]
    for r in results:
        print(json.dumps(r))
    ok = [r for r in results if r["to_command"] is not None and r["status"] == 0]
    summary = {"accel": args.accel, "runs": len(ok), "of": len(results),
               "load_before": [round(x, 2) for x in load_before],
               "load_after": [round(x, 2) for x in os.getloadavg()],
               "host": {"cpus": os.cpu_count(), "release": platform.release(), "python": platform.python_version()}}
    if ok:
        summary.update(
            median_to_command=statistics.median(r["to_command"] for r in ok),
            min_to_command=min(r["to_command"] for r in ok),
            max_to_command=max(r["to_command"] for r in ok),
            median_guest_uptime=statistics.median(r["guest_uptime"] for r in ok if r["guest_uptime"] is not None)
            if any(r["guest_uptime"] is not None for r in ok) else None,
            median_total=statistics.median(r["total"] for r in ok))
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"summary": summary, "runs": results}, fh, indent=2)
            fh.write("\n")


if __name__ == "__main__":
    main()
