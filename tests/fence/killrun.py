"""A fenced charge in a process of its own, for the SIGKILL test.

usage: python killrun.py DB_URL TABLE PROVIDER_DB JOB_ID TOKEN ALIVE(0|1)
Prints the charge id on success. RINGFENCE_FAULTS decides where it dies.
"""

from __future__ import annotations

import sys

from ringfence.fence import Fences, FenceStore, Owner
from ringfence.testing import FakeProvider


def main() -> None:
    url, table, provider_db, job_id, token, alive = sys.argv[1:7]
    store = FenceStore(url, table_name=table)
    provider = FakeProvider(provider_db)  # a file: the charge outlives this process
    owner = Owner(job_id, token, lease_s=60, alive=lambda j, t: alive == "1")
    with Fences(store, owner).open("order:kill", "charge", params={"amount": 500},
                                   provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            print(step.result["charge_id"])
            return
        ref = step.effect(lambda: provider.charge(500, idempotency_key=step.key))
        with step.complete(store.engine, result={"charge_id": ref}):
            pass
    print(ref)


if __name__ == "__main__":
    main()
