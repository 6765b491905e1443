"""`deployment: colocated` glue: an inference engine hosted inside the trainer's process.

It sits above the roles — it imports the inference server and the trainer's view of its own
weights — so that neither role imports the other: the trainer sees only the `ColocatedEngine`
protocol of its weight route (`transport/weights/colocated.py`), and `asyncrl train` hands it
this host: the receiving end of that route."""
