"""Example credit_core plugin: the ``position_decay`` strategy (see ``strategies``)."""
