"""Where weights come from: the tiny LM, the policies the trainer updates, chat formats, the packaged and the
demo's base models, the weights' hashes, and build.py, which makes a run's model (policy, engine, chat format)."""
