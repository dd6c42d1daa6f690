"""One module per notebook, named by the notebook's slug (``09_real_model.ipynb`` -> ``real_model``):
what its notebook and its studies (``studies/``) share: toy tasks, small models, training loops and
the claims checked on a study's record.

Lessons import the core and the shared machinery (``training``, ``plots``), never widgets,
exercises or the tools.
"""
