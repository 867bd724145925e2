#!/usr/bin/env python3
"""A pslite.torch script that says which role ran it (`RAN <role>`) and
whether torch was imported, then joins the job and leaves: under
`pslite launch --torch` only the workers may say so."""

import os
import sys

print(f"RAN {os.environ.get('DMLC_ROLE')} torch_before={'torch' in sys.modules}", flush=True)

import pslite.torch as pt  # noqa: E402  (imports torch)

pt.init()
print(f"WORKER {pt.rank()} of {pt.size()}", flush=True)
