"""What "start from an empty skeleton" fills a new definition's editor with: for each kind, the smallest spec that
says what a newcomer has to decide, with a comment on each choice. Each one validates as its kind (a test
checks it); references name what `make demo` seeds, so in the demo a skeleton also publishes as it is."""

SKELETONS = {
    "verifier": """\
# Layers run cheapest first: exact, environment, judge.
# The first layer that decides gives the reward.
layers:
  - name: answer
    kind: exact
    checks:
      - type: numeric            # Ctrl-Space: other types, fields
        reference: "{answer}"    # over the instance's hidden fields
        abs_tolerance: 0
pass_threshold: 1.0
""",
    "task_template": """\
system_prompt: ""
# A Python format string over each task instance's inputs.
prompt_template: "What is {a} + {b}? Answer with the number only."
sandbox_image: python-3-11      # where tool calls and checks run
verifier: numeric-exact         # what scores an answer
tools: []
limits:
  max_turns: 1
  max_tokens: 16
  max_seconds: 10
""",
    "sandbox_image": """\
layers:
  - type: base
    image: python-3.11-slim
  # more layers: python_packages (pinned, e.g. numpy==2.1.3), system_packages, files, setup_script
limits:
  memory_mb: 512
  wall_seconds: 60
  network: false
warm_pool_size: 2
""",
    "domain": """\
sampling_weight: 1.0             # this domain's share of a run's tasks, relative to the other domains
templates:
  - template: add-two
    weight: 1.0
""",
    "bundle": """\
# What a run trains on: domains (and, pinned through them, their templates, images and verifiers).
members:
  - domain/arithmetic@latest
# Settings a run on this bundle starts from, each taken by the kinds of run that have it (the run form can still
# change each), e.g. group_size: 8 for GRPO runs
run_config:
  # The model trained: builtin:demo-tiny is the studio's tiny demo model. Others: a packaged model such as
  # builtin:smollm2-135m-instruct, a model definition (model/SLUG, model/SLUG@N), or a local Hugging Face path.
  model: builtin:demo-tiny
""",
    "model": """\
source:
  type: builtin
  name: demo-tiny
licence: ""
""",
    "rubric": """\
questions:
  - key: verdict
    type: labels
    prompt: Is the answer right?
    labels: [correct, wrong, reward-hack]
  - key: notes
    type: text
    prompt: Anything else?
    required: false
""",
}
