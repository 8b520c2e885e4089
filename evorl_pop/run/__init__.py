"""The run machinery: the command line, the run shell, configs, the run folder
and its recorders, plots, processes and the launcher.

:func:`evorl_pop.train` and :func:`evorl_pop.resume` are the Python entry
points (:mod:`evorl_pop.run.shell`); ``evorl-pop`` the command line
(:mod:`evorl_pop.cli`).
"""
