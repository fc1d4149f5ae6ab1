"""Clean pipguard test-corpus package."""


def greet(name="world"):
    return "hello, %s, from legit_pure" % name


def main():
    print(greet())
    return 0
