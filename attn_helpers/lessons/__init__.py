"""One module per notebook, named by the notebook's slug (``09_real_model.ipynb`` -> ``real_model``):
its toy tasks, small models, experiments and ``claims(...)``, the named booleans the notebook
asserts and the tests re-check on freshly re-trained models.

Lessons import the core and the shared machinery (``training``, ``plots``), never widgets,
exercises or the tools.
"""
