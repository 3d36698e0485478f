"""Runs a client script's checks: those whose name starts with $OXGEN_CHECKS (all by
default), each reported as `ok NAME` or `FAILED NAME: reason` with its traceback; exits 1 if
any failed."""

import os
import sys
import traceback


def run(checks):
    only = os.environ.get("OXGEN_CHECKS", "")
    failed = 0
    for name, check in checks:
        if not name.startswith(only):
            continue
        try:
            check()
            print(f"ok {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit 1
            failed += 1
            print(f"FAILED {name}: {e}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)
