#!/usr/bin/env python3
"""A worker whose program raises: the launcher's failure table shows the
exception line, the traceback stays in the node's output."""

import pslite

po = pslite.Postoffice.from_env()
po.start()
if po.is_worker:
    def configure(lr):
        if lr < 0:
            raise ValueError(f"bad learning rate: {lr}")

    configure(-1)
po.finalize()
