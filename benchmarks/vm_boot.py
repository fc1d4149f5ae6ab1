"""Boot to the first instruction of the command under ``--isolation vm``.

    python benchmarks/vm_boot.py [--accel tcg|kvm] [--runs N]

Starts ``pipguard run --isolation vm --vm-accel ACCEL -- sh -c 'echo go'``
and takes the time from spawning pipguard to the guest's ``go`` on stdout
(pipguard's own start, QEMU, firmware, the guest kernel, init, the 9p mounts,
the guest's pipguard confining itself, the exec), and to pipguard's exit.
Prints one JSON line per run and the medians. Needs what ``pipguard doctor``
lists under vm.*; kvm needs a KVM that works (this machine's does not).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def once(accel: str) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pipguard", "run", "--isolation", "vm",
                                 "--vm-accel", accel, "--", "sh", "-c", "echo go"],
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first = None
        for line in proc.stdout:
            if line.strip() == b"go" and first is None:
                first = time.monotonic() - started
        proc.wait()
        return {"accel": accel, "to_command": round(first, 2) if first else None,
                "total": round(time.monotonic() - started, 2), "status": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accel", default="tcg", choices=("tcg", "kvm"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = [once(args.accel) for _ in range(args.runs)]
    for r in results:
        print(json.dumps(r))
    ok = [r for r in results if r["to_command"] is not None]
    if ok:
        print(json.dumps({"median_to_command": statistics.median(r["to_command"] for r in ok),
                          "median_total": statistics.median(r["total"] for r in ok),
                          "load": os.getloadavg()[0], "runs": len(ok)}))


if __name__ == "__main__":
    main()
