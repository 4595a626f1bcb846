"""Credit samples of a run: a few responses per recorded step with their token advantages.

Modules: ``records`` (the ``credit_samples.jsonl`` format: building, appending, reading),
``heatmap`` (the heat-map figure, in TensorBoard and in the ablation report), ``page`` (the
self-contained HTML page) and ``cli`` (``credit-view``). The backends record them:
``backends.torch.credit_samples`` in the native trainer, ``backends.trl.credit_samples`` in
TRL.
"""
