"""Ships ``hangtrace.pth`` (the activation line) into site-packages and builds the
optional C extension ``hangtrace.hooks._fastrec``.

setup.cfg holds all metadata. A ``.pth`` must sit at the top of site-packages, which
declarative configuration cannot express; this build_py copies it next to the
packages, for regular and editable (PEP 660) installs alike.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "hangtrace.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)
        self.copy_file(src, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return list(super().get_outputs(include_bytecode)) + [os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):
        mapping = dict(super().get_output_mapping())
        mapping[os.path.join(self.build_lib, PTH)] = PTH
        return mapping


class EditableWheelWithPth(editable_wheel):
    """PEP 660 editable installs: add the activation .pth to the editable wheel too."""

    def _select_strategy(self, *args, **kwargs):
        strategy = super()._select_strategy(*args, **kwargs)
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)

        class WithPth:
            def __call__(self, wheel, files, mapping):
                strategy(wheel, files, mapping)
                with open(src, "rb") as f:
                    wheel.writestr(PTH, f.read())

            def __enter__(self):
                strategy.__enter__()
                return self

            def __exit__(self, *exc):
                return strategy.__exit__(*exc)

        return WithPth()


# The per-collective hot path in C (hangtrace/hooks/_fastrec.c). Optional: without a
# compiler the build goes on and hangtrace records through the pure-Python path.
FASTREC = Extension("hangtrace.hooks._fastrec", ["hangtrace/hooks/_fastrec.c"], optional=True)

setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth}, ext_modules=[FASTREC])
