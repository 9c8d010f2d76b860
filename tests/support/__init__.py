"""Helpers shared by tests of more than one module: constants, builders, fakes and fixtures.

A test module imports shared helpers only from here (tests/test_support_imports.py), never from
another test module or a conftest. A fixture defined here is registered once: in tests/conftest.py
when every folder uses it, in a folder's conftest, or by a by-name import in the one module using it.
"""
