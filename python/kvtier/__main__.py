"""`python -m kvtier <command>`. Commands: doctor (kvtier/doctor.py)."""

import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kvtier doctor [--socket PATH]\n\n"
              "  doctor  checks the package, the kvtierd it reaches and the engines beside it")
        return 0 if argv else 2
    if argv[0] == "doctor":
        from kvtier import doctor
        return doctor.main(argv[1:])
    print(f"python -m kvtier: unknown command {argv[0]!r} (commands: doctor)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
