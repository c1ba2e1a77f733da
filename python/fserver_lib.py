"""StepMesh's `fserver_lib` on hetmesh: `import fserver_lib as f` runs StepMesh's programs on
hetmesh's engines, on any device plugin (hetmesh/stepmesh.py; docs/stepmesh.md)."""

from hetmesh.stepmesh import *  # noqa: F401,F403
from hetmesh.stepmesh import __all__  # noqa: F401
