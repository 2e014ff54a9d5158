"""The EAGLE-3 drafter shared by the train, export and bench ops.

Data flow: extract writes hidden-state shards -> ops.train fits this drafter on
them -> ops.export writes it in the engines' formats -> ops.bench decodes with
it. Nothing here is imported by the console (it needs torch); specs stay cheap.

Modules: config (sizes, read from the target's config.json), target_head
(the frozen embedding / final norm / LM head read tensor by tensor from the
target's safetensors), vocab (d2t / t2d), model (the drafter module), ttt
(the training-time-test unroll and its loss), data (the shard dataset and
token-budget batches), checkpoint (atomic save / newest / load), toy (tiny
targets and extractions for tests and smoke runs).
"""
