"""What every backend shares, below all of them: configuration errors and the credit keys'
parser, the built-in tasks and their prompts, the response mask, JSONL record files, the
frameworks' release checks, the command lines' error contract (``cli``) and preemption
(``preemption``). A backend imports this layer (and ``backends.samples``), never
a sibling backend."""
