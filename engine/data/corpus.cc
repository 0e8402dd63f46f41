#include "engine/data/corpus.h"

#include <array>
#include <string_view>

namespace mammoth::data {
namespace {

// splitmix64: tiny, and identical on every platform (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform enough for a story generator; exactness does not matter here, determinism does.
  size_t below(size_t n) { return static_cast<size_t>((next() >> 11) % n); }
  template <typename T, size_t N>
  const T& pick(const std::array<T, N>& items) {
    return items[below(N)];
  }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }

 private:
  uint64_t state_;
};

struct Person {
  std::string_view name;
  bool female;
};

struct Thing {
  std::string_view one;
  std::string_view many;
};

struct Activity {
  std::string_view base;
  std::string_view past;
};

constexpr std::array<Person, 16> kPeople = {{{"Lily", true},
                                             {"Tom", false},
                                             {"Mia", true},
                                             {"Ben", false},
                                             {"Sara", true},
                                             {"Max", false},
                                             {"Anna", true},
                                             {"Sam", false},
                                             {"Lucy", true},
                                             {"Jack", false},
                                             {"Emma", true},
                                             {"Leo", false},
                                             {"Zoe", true},
                                             {"Tim", false},
                                             {"Ella", true},
                                             {"Finn", false}}};
constexpr std::array<std::string_view, 6> kAnimals = {"cat", "dog", "bunny", "bird", "fox", "bear"};
constexpr std::array<std::string_view, 6> kTraits = {"little", "kind",    "happy",
                                                     "brave",  "curious", "shy"};
constexpr std::array<std::string_view, 8> kPlaces = {"park",  "garden", "forest", "beach",
                                                     "river", "farm",   "market", "hill"};
constexpr std::array<std::string_view, 5> kFamily = {"mom", "dad", "grandma", "big sister",
                                                     "little brother"};
constexpr std::array<Thing, 10> kThings = {{{"ball", "balls"},
                                            {"kite", "kites"},
                                            {"box", "boxes"},
                                            {"book", "books"},
                                            {"boat", "boats"},
                                            {"hat", "hats"},
                                            {"apple", "apples"},
                                            {"drum", "drums"},
                                            {"shell", "shells"},
                                            {"flower", "flowers"}}};
constexpr std::array<std::string_view, 10> kColors = {"red",  "blue", "big", "small", "shiny",
                                                      "soft", "old",  "new", "green", "yellow"};
constexpr std::array<Activity, 7> kActivities = {{{"play", "played"},
                                                  {"run", "ran"},
                                                  {"jump", "jumped"},
                                                  {"sing", "sang"},
                                                  {"dance", "danced"},
                                                  {"laugh", "laughed"},
                                                  {"draw", "drew"}}};
constexpr std::array<std::string_view, 4> kSpots = {"under a tree", "next to a rock",
                                                    "on the grass", "by the water"};
constexpr std::array<std::string_view, 10> kNumbers = {"zero", "one", "two",   "three", "four",
                                                       "five", "six", "seven", "eight", "nine"};

std::string capitalized(std::string_view s) {
  std::string out(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

// "a" or "an" followed by the word.
std::string a(std::string_view word) {
  const bool vowel = !word.empty() && std::string_view("aeiou").find(word[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + std::string(word);
}

std::string story(Rng& rng) {
  const Person hero = rng.pick(kPeople);
  Person friend_ = rng.pick(kPeople);
  while (friend_.name == hero.name) friend_ = rng.pick(kPeople);
  const std::string_view he = hero.female ? "she" : "he";
  const std::string_view his = hero.female ? "her" : "his";
  const std::string_view him = hero.female ? "her" : "him";
  const std::string He = capitalized(he);
  const std::string_view kind =
      rng.chance(50) ? (hero.female ? "girl" : "boy") : rng.pick(kAnimals);
  const std::string_view family = rng.pick(kFamily);
  const std::string_view place = rng.pick(kPlaces);
  const Thing thing = rng.pick(kThings);
  const std::string_view color = rng.pick(kColors);
  const Activity loves = rng.pick(kActivities);
  const Activity together = rng.pick(kActivities);
  const std::string name(hero.name);
  const std::string pal(friend_.name);

  std::string s;
  s += "Once upon a time, there was " + a(rng.pick(kTraits)) + " " + std::string(kind) + " named " +
       name + ". ";
  s += He + " lived in a small house near the " + std::string(rng.pick(kPlaces)) + " with " +
       std::string(his) + " " + std::string(family) + ". ";
  s += name + " loved to " + std::string(loves.base) + ".\n";
  s += "One day, " + name + " went to the " + std::string(place) + ". ";
  s += "There, " + std::string(he) + " saw " + a(color) + " " + std::string(thing.one) + " " +
       std::string(rng.pick(kSpots)) + ". ";
  s += He + " was very excited.\n";

  switch (rng.below(3)) {
    case 0:
      s += pal + " was at the " + std::string(place) + " too. ";
      s += "\"Is this your " + std::string(thing.one) + "?\" " + name + " asked. ";
      s += "\"Yes,\" said " + pal + ". \"Do you want to " + std::string(together.base) +
           " with me?\" ";
      s += name + " and " + pal + " " + std::string(together.past) + " together all day.\n";
      break;
    case 1: {
      const size_t n = 2 + rng.below(8);
      s += name + " found " + std::string(kNumbers[n]) + " " + std::string(thing.many) + ". ";
      s += He + " gave one " + std::string(thing.one) + " to " + pal + ". ";
      s += "Now " + name + " had " + std::string(kNumbers[n - 1]) + " " +
           std::string(n - 1 == 1 ? thing.one : thing.many) + ", and " + pal + " had one.\n";
      break;
    }
    default:
      s += "But the " + std::string(thing.one) + " was stuck in a tree. ";
      s += name + " could not reach it, and " + std::string(he) + " felt sad. ";
      s += "Then " + std::string(his) + " " + std::string(family) + " came and helped " +
           std::string(him) + ". ";
      s += name + " said, \"Thank you!\"\n";
      break;
  }
  s += "When the sun went down, " + name + " went home. ";
  s += He + " told " + std::string(his) + " " + std::string(family) + " about the " +
       std::string(color) + " " + std::string(thing.one) + ". ";
  s += name + " was happy, and " + std::string(he) + " slept well that night.";
  return s;
}

}  // namespace

std::vector<std::string> default_corpus_documents(size_t min_bytes, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < min_bytes) {
    docs.push_back(story(rng));
    total += docs.back().size() + 2;
  }
  return docs;
}

std::string default_corpus(size_t min_bytes, uint64_t seed) {
  std::string out;
  for (const std::string& d : default_corpus_documents(min_bytes, seed)) {
    if (!out.empty()) out += "\n\n";
    out += d;
  }
  return out;
}

}  // namespace mammoth::data
