"""Test-only stand-in for ``flash_attn`` (no CPU build exists), enough for OpenRLHF to import.

Only the pure-PyTorch helpers OpenRLHF imports at module level are provided
(``bert_padding`` and ``utils.distributed.all_gather``); there are no attention kernels.
Never installed: tests put ``tests/stubs`` on ``sys.path``
(see ``tests/helpers/openrlhf_stubs.py``).
"""

__version__ = "0.0.0+test.stub"
