"""agentrl's built-in tools (installed as the ``agentrl_tools`` package).

The repository folder is ``tools/``; it is installed under the distinct import name
``agentrl_tools`` so it can neither shadow nor be shadowed by other packages called ``tools``.

Modules (import the one you need; this package imports nothing itself):

* ``calculator`` - ``calculator``: safe arithmetic, no sandbox.
* ``bash``, ``python_tool``, ``editor``, ``search``, ``run_tests``, ``submit`` - ``bash``,
  ``python``, ``editor``, ``search``, ``run_tests``, ``submit``: the sandbox tools of coding
  tasks. They take the episode's sandbox and state by injection (use them in a
  :class:`agentrl.SandboxedToolEnv`), bound every result to 16,000 characters with a
  visible cut marker, and answer model mistakes with an ``Error: ...`` message instead of
  raising.
"""
