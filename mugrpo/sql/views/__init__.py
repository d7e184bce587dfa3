"""The views of the SQL catalog, one module per view or small family of views (:mod:`mugrpo.sql.catalog` creates them).

A view module declares ``NAMES`` (its views, in the order it creates them) and ``create(build)``, which creates them
on ``build.con`` over ``build.target`` (:class:`mugrpo.sql.views.base.Build`); its docstring describes its views.
:data:`mugrpo.sql.catalog.VIEW_MODULES` lists the modules in creation order, so a view may read one created before it.
A new view is a new module here and one line in that list.
"""
