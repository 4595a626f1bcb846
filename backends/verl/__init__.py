"""verl backend: ``algorithm.credit: datc`` in verl's own Hydra config (docs/verl.md).

Runs in its own environment (``make verl`` builds ``.venv-verl``: verl 0.9.1 needs
transformers < 5.11, OpenRLHF 0.11.2 needs 5.15). Modules: ``version`` (the supported verl
release, checked without importing verl), ``config`` (the credit keys, checked at
start-up), ``engine`` (``CreditFSDPEngine``: W0 from the old-log-prob forward), ``credit``
(verl's GRPO advantages -> token advantages), ``trainer`` (``CreditPPOTrainer``,
``trainer.v1.trainer_mode=credit_sync``), ``plugin`` (registers both with verl), ``cli``
(``credit-verl``). Nothing is imported here, so ``backends.verl.cli`` can report a missing
or unsupported verl as one message.
"""
