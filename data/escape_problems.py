r"""Small Python problems whose code is full of string escapes, for data/make_code_escapes.py.

Written for minirl (MIT, like the project), in HumanEval's record format: "task_id", "prompt"
(imports, the signature and a docstring with an example), "canonical_solution" (the body),
"test" (`def check(candidate):` of plain `assert candidate(...) == literal` lines) and
"entry_point". Each solution puts backslash escapes (`\n`, `\t`, `\\`, `\"`, `\'`, and `\s`, `\d`,
`\w`, `\b` in raw regexes) and double quotes on the very lines that compare, count, bound and
branch, so that a bug planted there sits on a line that JSON must escape: a model that writes
edit_file(old=..., new=...) for it has to write `\\` and `\"` inside a JSON string.

Each text below is the file's own text (a raw string), backslashes as the file holds them.
"""

PROBLEMS = [
    {
        "task_id": "Escapes/0",
        "entry_point": "count_lines",
        "prompt": r'''def count_lines(text):
    r"""Return how many lines the text has. A newline at the very end does not start
    another line, and the empty string has no lines.
    >>> count_lines("one\ntwo")
    2
    >>> count_lines("one\ntwo\n")
    2
    """
''',
        "canonical_solution": r"""    if text == "":
        return 0
    lines = text.count("\n") + 1
    if text[-1] == "\n":
        lines -= 1
    return lines
""",
        "test": r"""

def check(candidate):
    assert candidate("") == 0
    assert candidate("a") == 1
    assert candidate("a\nb") == 2
    assert candidate("a\nb\n") == 2
    assert candidate("\n") == 1
    assert candidate("a\n\nb") == 3
    assert candidate("\n\nx") == 3
    assert candidate("x\n\n") == 2
""",
    },
    {
        "task_id": "Escapes/1",
        "entry_point": "split_sentences",
        "prompt": r'''import re


def split_sentences(text, min_words):
    """Split the text into sentences, each ending at a run of '.', '?' and '!', and keep those
    of at least min_words words (a word is a run of letters, digits and underscores), without
    the spaces around them. An empty sentence is never kept.
    >>> split_sentences("Hi there. How are you?  Fine!", 2)
    ['Hi there', 'How are you']
    """
''',
        "canonical_solution": r"""    sentences = []
    for part in re.split(r'[.?!]+\s*', text):
        if part != "" and len(re.findall(r"\w+", part)) >= min_words:
            sentences.append(part.strip())
    return sentences
""",
        "test": r"""

def check(candidate):
    assert candidate("Hi there. How are you?  Fine!", 1) == ["Hi there", "How are you", "Fine"]
    assert candidate("Hi there. How are you?  Fine!", 2) == ["Hi there", "How are you"]
    assert candidate("Hi there. How are you?  Fine!", 3) == ["How are you"]
    assert candidate("Wait... what?!", 1) == ["Wait", "what"]
    assert candidate("One. . Two.", 0) == ["One", "Two"]
    assert candidate("no end", 1) == ["no end"]
    assert candidate("", 0) == []
    assert candidate("  Spaced out .Next", 1) == ["Spaced out", "Next"]
""",
    },
    {
        "task_id": "Escapes/2",
        "entry_point": "csv_field",
        "prompt": r'''def csv_field(value):
    """Write one field of a CSV file: a value that holds a double quote, a comma or a newline
    is put in double quotes, each double quote inside it doubled; any other value is written as
    it is.
    >>> print(csv_field('say "hi", then go'))
    "say ""hi"", then go"
    """
''',
        "canonical_solution": r"""    if '"' in value or "," in value or "\n" in value:
        return '"' + value.replace('"', '""') + '"'
    return value
""",
        "test": r'''

def check(candidate):
    assert candidate("abc") == "abc"
    assert candidate("a,b") == '"a,b"'
    assert candidate('say "hi"') == '"say ""hi"""'
    assert candidate("two\nlines") == '"two\nlines"'
    assert candidate("") == ""
    assert candidate('"') == '""""'
    assert candidate("x, y") == '"x, y"'
    assert candidate("tab\tis fine") == "tab\tis fine"
''',
    },
    {
        "task_id": "Escapes/3",
        "entry_point": "join_windows_path",
        "prompt": r'''def join_windows_path(parts):
    r"""Join the parts of a Windows path with backslashes. Backslashes at either end of a part
    are dropped first, and so are the parts this leaves empty; a path that is only a drive, such
    as "C:", ends in a backslash.
    >>> print(join_windows_path(["C:\\", "Users", "ann\\"]))
    C:\Users\ann
    """
''',
        "canonical_solution": r"""    cleaned = [part.strip("\\") for part in parts if len(part.strip("\\")) > 0]
    if len(cleaned) == 1 and cleaned[0].endswith(":"):
        return cleaned[0] + "\\"
    return "\\".join(cleaned)
""",
        "test": r"""

def check(candidate):
    assert candidate(["C:", "Users", "ann"]) == "C:\\Users\\ann"
    assert candidate(["C:\\", "\\Temp\\", "a.txt"]) == "C:\\Temp\\a.txt"
    assert candidate(["C:"]) == "C:\\"
    assert candidate(["D:\\"]) == "D:\\"
    assert candidate(["docs", "", "x.md"]) == "docs\\x.md"
    assert candidate(["readme.txt"]) == "readme.txt"
    assert candidate([]) == ""
    assert candidate(["\\\\", "a"]) == "a"
""",
    },
    {
        "task_id": "Escapes/4",
        "entry_point": "indent_level",
        "prompt": r'''def indent_level(line):
    r"""Return the indentation level of a line of code: each tab at its start is one level,
    and so is each run of four spaces there.
    >>> indent_level("\t\treturn x")
    2
    >>> indent_level("    \tx = 1")
    2
    """
''',
        "canonical_solution": r"""    level = 0
    while line.startswith("\t") or line.startswith("    "):
        level += 1
        line = line[1:] if line[0] == "\t" else line[4:]
    return level
""",
        "test": r"""

def check(candidate):
    assert candidate("x") == 0
    assert candidate("\tx") == 1
    assert candidate("\t\treturn x") == 2
    assert candidate("    \tx = 1") == 2
    assert candidate("        pass") == 2
    assert candidate("   x") == 0
    assert candidate("\t   x") == 1
    assert candidate("") == 0
    assert candidate("\t\t\t") == 3
""",
    },
    {
        "task_id": "Escapes/5",
        "entry_point": "mostly_digits",
        "prompt": r'''import re


def mostly_digits(text):
    """Whether digits make up more than half of the text's characters, whitespace not counted.
    >>> mostly_digits("12 ab 3")
    True
    >>> mostly_digits("a1 b2")
    False
    """
''',
        "canonical_solution": r"""    if text.strip() == "":
        return False
    digits = len(re.findall(r"\d", text))
    return digits * 2 > len(re.sub(r"\s", "", text))
""",
        "test": r"""

def check(candidate):
    assert candidate("12 ab 3") == True
    assert candidate("a1 b2") == False
    assert candidate("") == False
    assert candidate("   \t\n") == False
    assert candidate("7") == True
    assert candidate("1a") == False
    assert candidate("12a") == True
    assert candidate("x 9 9 y 9") == True
    assert candidate("no digits") == False
""",
    },
    {
        "task_id": "Escapes/6",
        "entry_point": "escape_quotes",
        "prompt": r'''def escape_quotes(s):
    r"""Put a backslash before each double quote and each backslash of s.
    >>> print(escape_quotes('say "hi"'))
    say \"hi\"
    """
''',
        "canonical_solution": r"""    out = ""
    for i in range(len(s)):
        if s[i] == '"' or s[i] == "\\":
            out += "\\"
        out += s[i]
    return out
""",
        "test": r"""

def check(candidate):
    assert candidate("plain") == "plain"
    assert candidate('say "hi"') == 'say \\"hi\\"'
    assert candidate("C:\\temp") == "C:\\\\temp"
    assert candidate("") == ""
    assert candidate('"') == '\\"'
    assert candidate("\\") == "\\\\"
    assert candidate('a"b\\c"') == 'a\\"b\\\\c\\"'
""",
    },
    {
        "task_id": "Escapes/7",
        "entry_point": "unquote",
        "prompt": r'''def unquote(s):
    r"""If s is wrapped in double quotes, return what lies between them with each \" turned
    into a plain "; otherwise return s as it is.
    >>> print(unquote('"say \\"hi\\""'))
    say "hi"
    """
''',
        "canonical_solution": r"""    if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        return s[1:-1].replace('\\"', '"')
    return s
""",
        "test": r"""

def check(candidate):
    assert candidate('"abc"') == "abc"
    assert candidate("abc") == "abc"
    assert candidate('"') == '"'
    assert candidate('""') == ""
    assert candidate('"say \\"hi\\""') == 'say "hi"'
    assert candidate('"abc') == '"abc'
    assert candidate('abc"') == 'abc"'
    assert candidate("'abc'") == "'abc'"
    assert candidate('"a"b"') == 'a"b'
""",
    },
    {
        "task_id": "Escapes/8",
        "entry_point": "long_words",
        "prompt": r'''import re


def long_words(text, n):
    """The words of the text with at least n characters, lower-cased, each once, in the order
    they first appear; a word is a run of letters, digits and underscores.
    >>> long_words("The cat saw THE other cat", 3)
    ['the', 'cat', 'saw', 'other']
    """
''',
        "canonical_solution": r"""    words = [w for w in re.findall(r"\w+", text.lower()) if len(w) >= n]
    found = []
    for word in words:
        if word not in found:
            found.append(word)
    return found
""",
        "test": r"""

def check(candidate):
    assert candidate("The cat saw THE other cat", 3) == ["the", "cat", "saw", "other"]
    assert candidate("The cat saw THE other cat", 4) == ["other"]
    assert candidate("a bb ccc", 1) == ["a", "bb", "ccc"]
    assert candidate("a bb ccc", 2) == ["bb", "ccc"]
    assert candidate("don't stop", 3) == ["don", "stop"]
    assert candidate("snake_case and x2", 2) == ["snake_case", "and", "x2"]
    assert candidate("", 1) == []
    assert candidate("Hi, hi! HI?", 2) == ["hi"]
""",
    },
    {
        "task_id": "Escapes/9",
        "entry_point": "expand_tabs",
        "prompt": r'''def expand_tabs(line, width):
    r"""Replace each tab of the line by spaces, as many as it takes to reach the next column
    that is a multiple of width.
    >>> expand_tabs("a\tbc\td", 4)
    'a   bc  d'
    """
''',
        "canonical_solution": r"""    out = ""
    for ch in line:
        if ch == "\t":
            out += " " * (width - len(out) % width)
        else:
            out += ch
    return out
""",
        "test": r"""

def check(candidate):
    assert candidate("a\tbc\td", 4) == "a   bc  d"
    assert candidate("\tx", 4) == "    x"
    assert candidate("abcd\te", 4) == "abcd    e"
    assert candidate("no tabs", 8) == "no tabs"
    assert candidate("\t\t", 2) == "    "
    assert candidate("ab\t", 3) == "ab "
    assert candidate("", 4) == ""
    assert candidate("a\tb", 8) == "a       b"
""",
    },
    {
        "task_id": "Escapes/10",
        "entry_point": "unescape",
        "prompt": r'''def unescape(s):
    r"""Turn the two-character escapes \n and \t of s into a newline and a tab, and \\ into one
    backslash; any other backslash is kept as it is.
    >>> unescape(r"one\ntwo")
    'one\ntwo'
    """
''',
        "canonical_solution": r"""    out, i = "", 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "nt\\":
            out += {"n": "\n", "t": "\t", "\\": "\\"}[s[i + 1]]
            i += 2
        else:
            out += s[i]
            i += 1
    return out
""",
        "test": r"""

def check(candidate):
    assert candidate(r"one\ntwo") == "one\ntwo"
    assert candidate(r"a\tb") == "a\tb"
    assert candidate(r"C:\\temp") == "C:\\temp"
    assert candidate("plain") == "plain"
    assert candidate("") == ""
    assert candidate("end\\") == "end\\"
    assert candidate(r"\x41") == r"\x41"
    assert candidate(r"\\n") == "\\n"
    assert candidate(r"\n\n") == "\n\n"
""",
    },
    {
        "task_id": "Escapes/11",
        "entry_point": "count_word",
        "prompt": r'''import re


def count_word(text, word):
    r"""How many times word occurs in the text as a whole word, not inside a longer word (at
    re's \b boundaries); case matters, and an empty word or text counts 0.
    >>> count_word("cat catalog cat's bobcat", "cat")
    2
    """
''',
        "canonical_solution": r"""    if word == "" or text == "":
        return 0
    pattern = r"\b" + re.escape(word) + r"\b"
    return len(re.findall(pattern, text))
""",
        "test": r"""

def check(candidate):
    assert candidate("cat catalog cat's bobcat", "cat") == 2
    assert candidate("Cat cat CAT", "cat") == 1
    assert candidate("", "cat") == 0
    assert candidate("a b", "") == 0
    assert candidate("x_1 x_1x x_1", "x_1") == 2
    assert candidate("1+1=2", "1") == 2
    assert candidate("dog", "dog") == 1
""",
    },
    {
        "task_id": "Escapes/12",
        "entry_point": "count_blank_lines",
        "prompt": r'''def count_blank_lines(text):
    r"""How many lines of the text are blank: empty, or only spaces and tabs. The lines are
    what splitting the text at each "\n" gives, so an empty text is one blank line.
    >>> count_blank_lines("a\n\n  \nb")
    2
    """
''',
        "canonical_solution": r"""    count = 0
    for line in text.split("\n"):
        if line.strip(" \t") == "":
            count += 1
    return count
""",
        "test": r"""

def check(candidate):
    assert candidate("a\n\n  \nb") == 2
    assert candidate("a") == 0
    assert candidate("") == 1
    assert candidate("\n") == 2
    assert candidate("x\n\t\ny\n \t \nz") == 2
    assert candidate("one\ntwo\nthree") == 0
    assert candidate("\n\n\n") == 4
""",
    },
    {
        "task_id": "Escapes/13",
        "entry_point": "needs_quotes",
        "prompt": r'''def needs_quotes(arg):
    """Whether an argument must be quoted on a shell's command line: it is empty, or it holds a
    space, a tab, a newline, a quote of either kind or a backslash.
    >>> needs_quotes("file.txt")
    False
    >>> needs_quotes("my file.txt")
    True
    """
''',
        "canonical_solution": r"""    if arg == "":
        return True
    for ch in arg:
        if ch in " \t\n\"'\\":
            return True
    return False
""",
        "test": r"""

def check(candidate):
    assert candidate("file.txt") == False
    assert candidate("my file.txt") == True
    assert candidate("") == True
    assert candidate("a\tb") == True
    assert candidate('say"hi') == True
    assert candidate("it's") == True
    assert candidate("C:\\dir") == True
    assert candidate("--verbose=2") == False
    assert candidate("line\n") == True
""",
    },
    {
        "task_id": "Escapes/14",
        "entry_point": "json_string",
        "prompt": r'''def json_string(s):
    r"""Write s as a JSON string: in double quotes, each double quote and backslash escaped by
    a backslash, and newlines and tabs written as \n and \t.
    >>> print(json_string('say "hi"'))
    "say \"hi\""
    """
''',
        "canonical_solution": r"""    out = '"'
    for ch in s:
        if ch in '"\\':
            out += "\\" + ch
        elif ch == "\n" or ch == "\t":
            out += "\\n" if ch == "\n" else "\\t"
        else:
            out += ch
    return out + '"'
""",
        "test": r"""

def check(candidate):
    assert candidate("abc") == '"abc"'
    assert candidate("") == '""'
    assert candidate('say "hi"') == '"say \\"hi\\""'
    assert candidate("a\\b") == '"a\\\\b"'
    assert candidate("two\nlines") == '"two\\nlines"'
    assert candidate("tab\there") == '"tab\\there"'
    assert candidate("\"\\\n\t") == '"\\"\\\\\\n\\t"'
""",
    },
    {
        "task_id": "Escapes/15",
        "entry_point": "parse_setting",
        "prompt": r'''def parse_setting(line):
    """Read a line such as 'name = "value"' as the pair (name, value), without the spaces
    around the name and the value; None when the line has no '=' or its value is not in double
    quotes.
    >>> parse_setting('color = "dark blue"')
    ('color', 'dark blue')
    """
''',
        "canonical_solution": r"""    name, sep, value = line.partition("=")
    value = value.strip()
    if sep != "=" or len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return None
    return (name.strip(), value[1:-1])
""",
        "test": r"""

def check(candidate):
    assert candidate('color = "dark blue"') == ("color", "dark blue")
    assert candidate('x="1"') == ("x", "1")
    assert candidate("x = 1") == None
    assert candidate('no equals "sign"') == None
    assert candidate('empty = ""') == ("empty", "")
    assert candidate('half = "open') == None
    assert candidate('q = "') == None
    assert candidate('eq = "a=b"') == ("eq", "a=b")
    assert candidate('  spaced   =   "v"  ') == ("spaced", "v")
""",
    },
    {
        "task_id": "Escapes/16",
        "entry_point": "parent_dir",
        "prompt": r'''import re


def parent_dir(path):
    r"""The folder that holds path, its parts joined with backslashes; in path they may be
    separated by slashes or backslashes. A path of one part has no parent: "".
    >>> print(parent_dir("C:/Users\\ann/notes.txt"))
    C:\Users\ann
    """
''',
        "canonical_solution": r"""    parts = [part for part in re.split(r"[\\/]+", path) if part != ""]
    if len(parts) <= 1:
        return ""
    return "\\".join(parts[:-1])
""",
        "test": r"""

def check(candidate):
    assert candidate("C:/Users\\ann/notes.txt") == "C:\\Users\\ann"
    assert candidate("a\\b") == "a"
    assert candidate("a") == ""
    assert candidate("") == ""
    assert candidate("/usr//local/bin/") == "usr\\local"
    assert candidate("x\\y\\z") == "x\\y"
    assert candidate("\\\\server\\share\\f") == "server\\share"
""",
    },
    {
        "task_id": "Escapes/17",
        "entry_point": "strip_comment",
        "prompt": r'''def strip_comment(line):
    """Cut a '#' comment, and the spaces before it, off the end of a line of code, but keep a
    '#' that is inside double quotes.
    >>> strip_comment('x = "#1"  # the first')
    'x = "#1"'
    """
''',
        "canonical_solution": r"""    inside = False
    for i in range(len(line)):
        if line[i] == '"':
            inside = not inside
        elif line[i] == "#" and not inside:
            return line[:i].rstrip()
    return line.rstrip()
""",
        "test": r"""

def check(candidate):
    assert candidate('x = "#1"  # the first') == 'x = "#1"'
    assert candidate("# only a comment") == ""
    assert candidate("y = 2") == "y = 2"
    assert candidate('s = "a" + "b"  # join') == 's = "a" + "b"'
    assert candidate('t = "unclosed # here') == 't = "unclosed # here'
    assert candidate("z = 1#2") == "z = 1"
    assert candidate('"#" # "#"') == '"#"'
    assert candidate("w = 3 #") == "w = 3"
    assert candidate("") == ""
""",
    },
    {
        "task_id": "Escapes/18",
        "entry_point": "does_nothing",
        "prompt": r'''def does_nothing(line):
    r"""Whether a line of code does nothing: it is blank (spaces, tabs, \r and \n only), a '#'
    comment, or pass.
    >>> does_nothing("\t# note")
    True
    """
''',
        "canonical_solution": r"""    stripped = line.strip(" \t\r\n")
    if stripped == "" or stripped == "pass":
        return True
    return stripped[0] == "#"
""",
        "test": r"""

def check(candidate):
    assert candidate("\t# note") == True
    assert candidate("") == True
    assert candidate(" \t \r\n") == True
    assert candidate("    pass\n") == True
    assert candidate("x = 1  # set x") == False
    assert candidate("print('#')") == False
    assert candidate("passed = True") == False
    assert candidate("#") == True
""",
    },
    {
        "task_id": "Escapes/19",
        "entry_point": "tsv_fields",
        "prompt": r'''def tsv_fields(line, columns):
    r"""Split one line of a tab-separated file into its fields, the line's final "\n" dropped;
    None when it does not have exactly `columns` fields.
    >>> tsv_fields("ann\t31\tOslo\n", 3)
    ['ann', '31', 'Oslo']
    """
''',
        "canonical_solution": r"""    line = line.rstrip("\n")
    if line.count("\t") + 1 != columns:
        return None
    return line.split("\t")
""",
        "test": r"""

def check(candidate):
    assert candidate("ann\t31\tOslo\n", 3) == ["ann", "31", "Oslo"]
    assert candidate("ann\t31\tOslo", 3) == ["ann", "31", "Oslo"]
    assert candidate("ann\t31", 3) == None
    assert candidate("a\tb\tc\td", 3) == None
    assert candidate("single", 1) == ["single"]
    assert candidate("\t", 2) == ["", ""]
    assert candidate("x\t\ty\n", 3) == ["x", "", "y"]
    assert candidate("", 1) == [""]
""",
    },
    {
        "task_id": "Escapes/20",
        "entry_point": "possessive",
        "prompt": r'''def possessive(name):
    """The possessive form of a name: an apostrophe alone after a final s or S, else 's. An
    empty name stays empty.
    >>> possessive("James")
    "James'"
    >>> possessive("Ann")
    "Ann's"
    """
''',
        "canonical_solution": r"""    if name == "":
        return name
    if name[-1] in "sS":
        return name + '\''
    return name + '\'s'
""",
        "test": r"""

def check(candidate):
    assert candidate("James") == "James'"
    assert candidate("Ann") == "Ann's"
    assert candidate("BOSS") == "BOSS'"
    assert candidate("") == ""
    assert candidate("s") == "s'"
    assert candidate("Sam") == "Sam's"
    assert candidate("Charles") == "Charles'"
""",
    },
    {
        "task_id": "Escapes/21",
        "entry_point": "number_lines",
        "prompt": r'''def number_lines(text, start):
    r"""Put before each line of the text its number, counting from start, and a tab.
    >>> number_lines("a\nb", 1)
    '1\ta\n2\tb'
    """
''',
        "canonical_solution": r"""    lines = text.split("\n")
    numbered = [str(start + i) + "\t" + lines[i] for i in range(len(lines))]
    return "\n".join(numbered)
""",
        "test": r"""

def check(candidate):
    assert candidate("a\nb", 1) == "1\ta\n2\tb"
    assert candidate("x", 1) == "1\tx"
    assert candidate("", 1) == "1\t"
    assert candidate("a\nb\nc", 0) == "0\ta\n1\tb\n2\tc"
    assert candidate("one\n\nthree", 10) == "10\tone\n11\t\n12\tthree"
    assert candidate("end\n", 5) == "5\tend\n6\t"
""",
    },
    {
        "task_id": "Escapes/22",
        "entry_point": "count_code_lines",
        "prompt": r'''def count_code_lines(text):
    r"""How many lines of the text hold code: lines that are neither blank (only spaces and
    tabs) nor a '#' comment.
    >>> count_code_lines("x = 1\n\n# note\n\ty = 2  # two")
    2
    """
''',
        "canonical_solution": r"""    count = 0
    for line in text.split("\n"):
        stripped = line.strip(" \t")
        if stripped != "" and not stripped.startswith("#"):
            count += 1
    return count
""",
        "test": r"""

def check(candidate):
    assert candidate("x = 1\n\n# note\n\ty = 2  # two") == 2
    assert candidate("") == 0
    assert candidate("pass") == 1
    assert candidate("# a\n  # b\n\t\n") == 0
    assert candidate("a\nb\nc") == 3
    assert candidate("\tif x:\n\t\treturn 1\n") == 2
    assert candidate(" \t \n#\nz") == 1
""",
    },
]
