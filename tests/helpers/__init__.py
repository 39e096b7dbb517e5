"""Shared helpers of the tests (no tests here): imported as `tests.helpers.<module>` by test files in
every folder, so a test file never imports another test file's internals."""
