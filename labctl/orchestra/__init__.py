"""The LLM orchestra (issue 12): the warm set of models phase 3 trains against.

Planning is pure and lives here: the orchestra file (`spec`), where models go on GPUs and what
the lab holds (`place`), and who leaves, who joins and in which order (`choose`). Nothing in
these modules touches a host.
"""
