"""The vocabularies the generators draw from (plain words, so any tokenizer reads them)."""

NAMES = (
    "Mia",
    "Leo",
    "Ava",
    "Noah",
    "Zoe",
    "Liam",
    "Ivy",
    "Owen",
    "Ruby",
    "Eli",
    "Nora",
    "Finn",
    "Lena",
    "Hugo",
    "Cleo",
    "Omar",
    "Jade",
    "Theo",
    "Iris",
    "Max",
    "Vera",
    "Ezra",
    "Maya",
    "Jon",
)
THINGS = ("locker", "bike lock", "safe", "garage", "mailbox", "suitcase", "storage unit")
# the bounded-memory probe needs more distinct locks than the reuse family (24 x 17 = 408)
STORAGE = (*THINGS, "desk", "cabinet", "gym bag", "toolbox", "shed", "gate", "car", "phone", "laptop", "diary")
CHAT = (
    "How was your weekend?",
    "It was fine, I went hiking by the lake.",
    "Did you watch the game last night?",
    "No, I was busy cooking dinner for friends.",
    "The weather is lovely today.",
    "I might go to the beach if it stays sunny.",
    "Have you tried the new bakery downtown?",
    "Yes, their bread is excellent.",
    "My sister is visiting next month.",
    "That sounds fun, say hello from me.",
    "I am reading a book about old ships.",
    "Work has been busy this week.",
)
ADJECTIVES = ("quiet", "bright", "old", "small", "green", "heavy", "calm", "distant", "warm", "narrow", "tall", "soft")
NOUNS = ("river", "garden", "village", "window", "mountain", "library", "market", "bridge", "forest", "harbor")
VERBS = ("faces", "follows", "hides", "crosses", "borders", "shelters", "overlooks", "touches")
COLORS = ("red", "blue", "amber", "violet", "silver", "golden", "green", "white", "black", "orange")
ANIMALS = ("fox", "owl", "heron", "otter", "lynx", "badger", "falcon", "beaver", "raven", "moose", "hare", "wolf")
CITIES = ("Oslo", "Lima", "Cairo", "Quito", "Perth", "Turin", "Dakar", "Hanoi", "Porto", "Tunis", "Riga", "Accra")
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
