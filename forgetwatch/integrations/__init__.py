"""forgetwatch inside training front-ends configured by YAML: Axolotl (a plugin) and LLaMA-Factory (a launcher).

Importing this package imports no front-end: each module imports its own only when it is used.
"""
