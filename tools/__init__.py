"""agentrl's built-in tools (installed as the ``agentrl_tools`` package).

The repository folder is ``tools/``; it is installed under the distinct import name
``agentrl_tools`` so it can neither shadow nor be shadowed by other packages called ``tools``.

Every tool is importable by name: ``from agentrl_tools import bash, editor``.

* ``calculator``: safe arithmetic, no sandbox.
* ``bash``, ``python``, ``editor``, ``search``, ``run_tests``, ``submit``: the sandbox tools of
  coding tasks. They take the episode's sandbox and state by injection (use them in a
  :class:`agentrl.SandboxedToolEnv`), bound every result to 16,000 characters with a
  visible cut marker, and answer model mistakes with an ``Error: ...`` message instead of
  raising.

Each tool lives in the module of the same name (``python`` in ``python_tool``). As attributes of
this package those names are the tools, not the modules, so import a module's helpers from the
module itself: ``from agentrl_tools.bash import episode_shell``.
"""

# Imported eagerly (about 50 ms, after agentrl itself): a lazy module __getattr__ would not work
# here, because importing a submodule such as agentrl_tools.bash binds the package attribute
# "bash" to the module, and __getattr__ is only consulted for missing attributes.
from agentrl_tools.bash import bash
from agentrl_tools.calculator import calculator
from agentrl_tools.editor import editor
from agentrl_tools.python_tool import python
from agentrl_tools.run_tests import run_tests
from agentrl_tools.search import search
from agentrl_tools.submit import submit

__all__ = ["bash", "calculator", "editor", "python", "run_tests", "search", "submit"]
