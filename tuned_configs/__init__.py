"""The tuned configs shipped with fa2gen, installed as the package ``fa2gen.tuned_configs``.

This file makes the folder a regular package: ``importlib.resources.files()`` then gives a
real directory once installed (a namespace package gives a MultiplexedPath instead).
"""
