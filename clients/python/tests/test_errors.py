"""The exceptions' names: every exception class the package exports ends
in Error (PEP 8), and the names it had before (InvalidArgument, ...) stay
as aliases of the same classes, exported as before, so that code written
against them keeps working."""

import unittest

import grpc

import coordd
from coordd import _common

# The names before the rename, and the classes' names now.
RENAMED = {
    "InvalidArgument": "InvalidArgumentError",
    "Unauthenticated": "UnauthenticatedError",
    "PermissionDenied": "PermissionDeniedError",
    "Unavailable": "UnavailableError",
    "ResourceExhausted": "ResourceExhaustedError",
    "BodyTooLarge": "BodyTooLargeError",
    "DeadlineExceeded": "DeadlineExceededError",
    "Cancelled": "CancelledError",
    "BadStream": "BadStreamError",
}


class ErrorNamesTest(unittest.TestCase):
    def test_every_exception_class_ends_in_error(self):
        classes = 0
        for name in coordd.__all__:
            obj = getattr(coordd, name)
            if not (isinstance(obj, type) and issubclass(obj, BaseException)):
                continue
            classes += 1
            if name in RENAMED:
                continue  # an alias: test_old_names_are_aliases
            self.assertTrue(name.endswith("Error"), f"coordd.{name} does not end in Error")
            self.assertEqual(obj.__name__, name)
            self.assertTrue(issubclass(obj, coordd.CoorddError), name)
        # CoorddError, UnreachableError (new, no old name), each renamed
        # class and its alias.
        self.assertEqual(classes, 2 + 2 * len(RENAMED))

    def test_old_names_are_aliases(self):
        for old, new in RENAMED.items():
            with self.subTest(old=old):
                self.assertIn(new, coordd.__all__)
                self.assertIn(old, coordd.__all__)
                self.assertIs(getattr(coordd, old), getattr(coordd, new))
                self.assertIs(getattr(_common, old), getattr(_common, new))
                self.assertEqual(getattr(coordd, new).__name__, new)

    def test_star_import_has_both_names(self):
        ns = {}
        exec("from coordd import *", ns)
        for old, new in RENAMED.items():
            self.assertIs(ns[old], ns[new])

    def test_caught_by_either_name(self):
        for code, old in [
            (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"),
            (grpc.StatusCode.UNAUTHENTICATED, "Unauthenticated"),
            (grpc.StatusCode.PERMISSION_DENIED, "PermissionDenied"),
            (grpc.StatusCode.UNAVAILABLE, "Unavailable"),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted"),
            (grpc.StatusCode.FAILED_PRECONDITION, "BodyTooLarge"),
            (grpc.StatusCode.DEADLINE_EXCEEDED, "DeadlineExceeded"),
            (grpc.StatusCode.CANCELLED, "Cancelled"),
        ]:
            with self.subTest(code=code):
                err = _common.error_from(code, "details", ())
                self.assertIs(type(err), getattr(coordd, RENAMED[old]))
                with self.assertRaises(getattr(coordd, old)):
                    raise err
                with self.assertRaises(getattr(coordd, RENAMED[old])):
                    raise err

    def test_str_names_the_class_for_the_clients_own_errors(self):
        self.assertEqual(str(coordd.BadStreamError("stream ended without metadata")),
                         "BadStreamError: stream ended without metadata")
        self.assertEqual(str(coordd.BadStream("x")), "BadStreamError: x")

    def test_not_asyncio_cancelled_error(self):
        # coordd.CancelledError is a call coordd (or gRPC) ended as
        # CANCELLED; a cancelled task still raises asyncio.CancelledError.
        import asyncio

        self.assertFalse(issubclass(coordd.CancelledError, asyncio.CancelledError))
        self.assertTrue(issubclass(coordd.CancelledError, coordd.CoorddError))


if __name__ == "__main__":
    unittest.main()
