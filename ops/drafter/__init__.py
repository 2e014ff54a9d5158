"""The EAGLE-3 drafter shared by the train, export and bench ops.

Data flow: extract writes hidden-state shards -> ops.train fits this drafter on
them -> ops.export writes it in the engines' formats -> ops.bench decodes with
it. Nothing here is imported by the console (it needs torch); specs stay cheap.

Modules: config (sizes, read from the target's config.json), target_head
(the frozen embedding / final norm / LM head read tensor by tensor from the
target's safetensors), vocab (d2t / t2d), model (the drafter module), ttt
(the training-time-test unroll and its loss), data (the shard dataset and
token-budget batches), checkpoint (atomic save / newest / load), formats (the
two on-disk formats export writes and bench reads), toy (tiny targets and
extractions for tests and smoke runs).

Below the stages (pyproject's ops layers): it imports none of them, so train,
export and bench share it without borrowing from one another.
"""
