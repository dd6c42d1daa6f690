"""Notebook 02's data: section 1's query and the categories of its six keys (the widget's
``DEMO_KEYS``), and section 2's sentence with its features."""

QUERY = (1.0, 0.4)                  # section 1's query, between the animals and the fruit
CATEGORIES = ("animal", "vehicle", "fruit")
PLANE_VALUES = (0, 0, 1, 1, 2, 2)   # the category of each of the six keys, in order

TOKENS = ("the", "cat", "sat", "on", "the", "mat")
FEATURES = ("det", "noun", "animal", "verb", "prep", "place")
EMBEDDING = {                       # one row per word: which features it has
    "the": (1, 0, 0, 0, 0, 0), "cat": (0, 1, 1, 0, 0, 0), "sat": (0, 0, 0, 1, 0, 0),
    "on": (0, 0, 0, 0, 1, 0), "mat": (0, 1, 0, 0, 0, 1),
}
LOOKS_FOR = {"det": "noun", "verb": "animal", "prep": "place", "animal": "verb", "place": "prep"}
