"""pyproject.toml holds the project's metadata; this file only keeps the tests that sit beside the
modules (`*_test.py`, `conftest.py`) out of the wheel, which pyproject.toml cannot say: setuptools'
package-data excludes do not apply to modules."""
from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithoutTests(build_py):
    def find_package_modules(self, package, package_dir):
        return [(pkg, module, path) for pkg, module, path
                in super().find_package_modules(package, package_dir)
                if not module.endswith("_test") and module != "conftest"]


setup(cmdclass={"build_py": BuildPyWithoutTests})
