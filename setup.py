"""Metadata lives in pyproject.toml. This file adds one thing pyproject cannot say: the
first-contact line (``python/sglang_dynamic_eagle_first_contact.pth``) goes to the root of
site-packages, where Python runs it at start-up (see ``sglang_compat/first_contact.py``)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "sglang_dynamic_eagle_first_contact.pth"


class BuildPyWithFirstContact(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("python", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithFirstContact})
