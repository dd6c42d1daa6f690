"""Only a workaround; the package is configured in pyproject.toml.

An editable install (``pip install -e .``, what requirements.txt does) must also put
``jupyter-config/jupyter_server_config.d/attn_helpers.json`` into the environment's
``etc/jupyter`` (pyproject.toml, ``[tool.setuptools.data-files]``), so that a plain ``jupyter lab``
uses the course's kernel websocket setting. setuptools' editable wheel installs data files only
when the distribution answers ``has_data()`` (its ``Distribution`` only has ``has_data_files()``),
so without this an editable install silently leaves the file out; a regular install does not.
"""

from setuptools import setup
from setuptools.dist import Distribution


class _DataFilesInEditableInstalls(Distribution):
    def has_data(self) -> bool:
        return bool(self.has_data_files())


setup(distclass=_DataFilesInEditableInstalls)
