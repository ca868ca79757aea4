"""greeter: prints friendly greetings."""

VERSION = "1.4.2"
