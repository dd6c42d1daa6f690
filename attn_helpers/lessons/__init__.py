"""One module per notebook, named by its slug (``09_real_model.ipynb`` -> ``real_model``): what the
notebook and its studies share (toy tasks, small models, the claims checked on a study's record).
Lessons import the core and the shared machinery, never widgets, exercises or the tools."""
