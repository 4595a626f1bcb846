"""The ablation runner: DATC against GRPO and the controls, across settings and families.

``python -m ablations configs/ablate/quick.yaml`` trains the same pretrained
policy under every listed credit strategy, for each built-in setting, model family and seed,
then writes ``report.md`` (tables with means and 95% intervals over seeds, paired
differences to the baseline, verdicts), ``results.csv`` (one row per run and step) and PNG
figures (reward curves, a credit heat-map). Resumable; ``--shard i/n`` + ``merge`` spread it
over machines. The package runs only the layout check; its modules are imported by name
(``from ablations.runner import run_ablation``), so a light one (``supervision``) stays light.

Modules: ``ablation_config`` (the YAML schema), ``settings`` (the four built-in settings,
with ``word_tasks``, ``corpus``, ``pretrain``, ``rm_train``, ``cache``), ``runner`` (plan, train,
merge), ``supervision`` (worker processes and their supervisor), ``probes`` (exact held-out
scores and credit examples from a trained policy), ``results`` (result files and
results.csv), ``stats`` and ``summary`` (statistics), ``report`` and ``figures`` (outputs).
"""

from credit_core.layout import check_layout

check_layout()
