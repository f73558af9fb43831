// Regexes over op names rather than characters: "a-(b|c){0,2}-d" matches the op sequence a, then
// up to two of b or c, then d. Parsed to a small tree, then compiled to a Thompson automaton over
// the names the pattern mentions (bounded repeats unrolled). Matching follows every state at
// once, so there is no backtracking blow-up and no recursion on the input's length.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

constexpr size_t kMaxStates = 20000;  // repeats like ((a){999}){999} must not exhaust memory

struct Node {
  enum Type { name, sequence, choice } type = name;
  std::string text;                          // type name
  std::vector<std::unique_ptr<Node>> parts;  // sequence / choice
  int min = 1, max = 1;                      // repetitions; max −1: unbounded
  size_t at = 0;                             // character of its quantifier, for errors
};

bool is_name_char(char c) {
  return c != '(' && c != ')' && c != '|' && c != '-' && c != '{' && c != '}' && c != '?' && c != '*' && c != '+' &&
         c != ' ' && c != '\t';
}

// Recursive descent over: choice = sequence ('|' sequence)*; sequence = piece ('-' piece)*;
// piece = (name | '(' choice ')') quantifier?; quantifier = ? * + {m} {m,} {m,n}.
struct Parser {
  const std::string& s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const { fail_at(what, i); }
  [[noreturn]] void fail_at(const std::string& what, size_t at) const {
    throw std::invalid_argument(fmt::format("pattern '{}': {} at character {}", s, what, at + 1));
  }
  void skip_space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool eat(char c) {
    skip_space();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }

  std::unique_ptr<Node> choice(int depth) {
    if (depth > 32) fail("groups nested too deeply");
    auto first = sequence(depth);
    if (!eat('|')) return first;
    auto node = std::make_unique<Node>();
    node->type = Node::choice;
    node->parts.push_back(std::move(first));
    do node->parts.push_back(sequence(depth));
    while (eat('|'));
    return node;
  }

  std::unique_ptr<Node> sequence(int depth) {
    auto node = std::make_unique<Node>();
    node->type = Node::sequence;
    do node->parts.push_back(piece(depth));
    while (eat('-'));
    return node;
  }

  std::unique_ptr<Node> piece(int depth) {
    std::unique_ptr<Node> node;
    skip_space();
    if (eat('(')) {
      node = choice(depth + 1);
      if (!eat(')')) fail("expected ')'");
    } else {
      const size_t start = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      if (i == start) fail("expected an op name");
      node = std::make_unique<Node>();
      node->text = s.substr(start, i - start);
    }
    quantifier(*node);
    return node;
  }

  int number() {
    skip_space();
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start || i - start > 4) fail("expected a repeat count");
    return std::stoi(s.substr(start, i - start));
  }

  void quantifier(Node& node) {
    // A quantified group is wrapped, so "(a-b){0,1}" repeats the whole group.
    int min = 1, max = 1;
    skip_space();
    const size_t at = i;
    if (eat('?')) min = 0;
    else if (eat('*')) min = 0, max = -1;
    else if (eat('+')) max = -1;
    else if (eat('{')) {
      min = max = number();
      if (eat(',')) max = (skip_space(), i < s.size() && s[i] == '}') ? -1 : number();
      if (!eat('}')) fail("expected '}'");
      if (max >= 0 && max < min) fail("repeat range is backwards");
    } else {
      return;
    }
    if (node.min != 1 || node.max != 1) fail("two quantifiers in a row");
    node.min = min, node.max = max, node.at = at;
  }
};

using State = Pattern::State;

// Tree → states. A fragment is its start state and the exits still to be pointed at what follows.
struct Compiler {
  const Parser& parser;
  std::vector<State>& states;
  std::vector<std::string>& names;

  struct Exit {  // by index: `states` grows while fragments are built
    int state;
    bool other;
  };
  struct Frag {
    int start;
    std::vector<Exit> exits;
  };

  int add(int name, const Node& at) {
    if (states.size() >= kMaxStates) parser.fail_at("repeats make the pattern too large", at.at);
    states.push_back({name, -1, -1});
    return static_cast<int>(states.size() - 1);
  }
  void patch(const std::vector<Exit>& exits, int to) {
    for (const Exit& e : exits) (e.other ? states[e.state].other : states[e.state].next) = to;
  }
  int name_index(const std::string& text) {
    const auto it = std::find(names.begin(), names.end(), text);
    if (it != names.end()) return static_cast<int>(it - names.begin());
    names.push_back(text);
    return static_cast<int>(names.size() - 1);
  }

  Frag empty(const Node& at) {
    const int s = add(Pattern::kSplit, at);
    return {s, {{s, false}}};
  }
  Frag then(Frag a, Frag b) {
    patch(a.exits, b.start);
    return {a.start, std::move(b.exits)};
  }
  Frag optional(Frag a, const Node& at) {  // a or nothing
    const int s = add(Pattern::kSplit, at);
    states[s].next = a.start;
    a.exits.push_back({s, true});
    return {s, std::move(a.exits)};
  }
  Frag star(Frag a, const Node& at) {  // a, any number of times
    const int s = add(Pattern::kSplit, at);
    states[s].next = a.start;
    patch(a.exits, s);
    return {s, {{s, true}}};
  }

  // The node once, ignoring its own quantifier.
  Frag once(const Node& n) {
    switch (n.type) {
      case Node::name: {
        const int s = add(name_index(n.text), n);
        return {s, {{s, false}}};
      }
      case Node::sequence: {
        Frag f = build(*n.parts[0]);
        for (size_t k = 1; k < n.parts.size(); ++k) f = then(std::move(f), build(*n.parts[k]));
        return f;
      }
      case Node::choice: {
        Frag f = build(*n.parts.back());
        for (size_t k = n.parts.size() - 1; k-- > 0;) {
          Frag a = build(*n.parts[k]);
          const int s = add(Pattern::kSplit, n);
          states[s].next = a.start, states[s].other = f.start;
          a.exits.insert(a.exits.end(), f.exits.begin(), f.exits.end());
          f = {s, std::move(a.exits)};
        }
        return f;
      }
    }
    return empty(n);
  }

  // The node with its repeats: min copies, then max − min optional ones (or a loop).
  Frag build(const Node& n) {
    if (n.min == 1 && n.max == 1) return once(n);
    Frag f = empty(n);
    for (int k = 0; k < n.min; ++k) f = then(std::move(f), once(n));
    if (n.max < 0) return then(std::move(f), star(once(n), n));
    for (int k = n.min; k < n.max; ++k) f = then(std::move(f), optional(once(n), n));
    return f;
  }
};

// The states reachable from `from` without consuming a name, added to `set` once each.
void close(const std::vector<State>& states, int from, std::vector<int>& set, std::vector<uint32_t>& seen,
           uint32_t stamp, std::vector<int>& stack) {
  stack.assign(1, from);
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    if (s < 0 || seen[s] == stamp) continue;
    seen[s] = stamp;
    set.push_back(s);
    if (states[s].name == Pattern::kSplit) stack.push_back(states[s].other), stack.push_back(states[s].next);
  }
}

// Per-thread scratch, so a match allocates nothing once warm.
struct Scratch {
  std::vector<int> current, next, stack;
  std::vector<uint32_t> seen;
  uint32_t stamp = 0;
  uint32_t fresh(size_t states) {
    if (seen.size() < states || stamp == UINT32_MAX) seen.assign(std::max(seen.size(), states), 0), stamp = 0;
    return ++stamp;
  }
};

}  // namespace

Pattern::Pattern(const std::string& text) : text_(text) {
  Parser p{text_};
  const std::unique_ptr<Node> root = p.choice(0);
  p.skip_space();
  if (p.i != text_.size()) p.fail("unexpected character");
  Compiler c{p, states_, names_};
  Compiler::Frag f = c.build(*root);
  states_.push_back({kAccept, -1, -1});
  c.patch(f.exits, static_cast<int>(states_.size() - 1));
  start_ = f.start;
  // What the first step can consume, and whether the pattern can match nothing.
  std::vector<int> set, stack;
  std::vector<uint32_t> seen(states_.size(), 0);
  close(states_, start_, set, seen, 1, stack);
  first_.assign(names_.size(), 0);
  for (int s : set) {
    if (states_[s].name >= 0) first_[states_[s].name] = 1;
    if (states_[s].name == kAccept) nullable_ = true;
  }
}

bool Pattern::can_start(const std::string& name) const {
  if (nullable_) return true;
  const auto it = std::find(names_.begin(), names_.end(), name);
  return it != names_.end() && first_[it - names_.begin()];
}

size_t Pattern::match(const uint32_t* ops, size_t n, size_t begin, const std::vector<int16_t>& name_of) const {
  if (begin >= n) return 0;
  const int first = name_of[ops[begin]];
  if (!nullable_ && (first < 0 || !first_[first])) return 0;
  thread_local Scratch scratch;
  Scratch& x = scratch;
  x.current.clear();
  close(states_, start_, x.current, x.seen, x.fresh(states_.size()), x.stack);
  size_t longest = 0;
  for (size_t i = begin; i < n && !x.current.empty(); ++i) {
    const int name = name_of[ops[i]];
    if (name < 0) break;
    x.next.clear();
    const uint32_t stamp = x.fresh(states_.size());
    bool accepted = false;
    for (int s : x.current)
      if (states_[s].name == name) close(states_, states_[s].next, x.next, x.seen, stamp, x.stack);
    for (int s : x.next) accepted |= states_[s].name == kAccept;
    if (accepted) longest = i + 1 - begin;
    x.current.swap(x.next);
  }
  return longest;
}

size_t Pattern::match(const std::vector<const std::string*>& names, size_t begin) const {
  std::vector<uint32_t> ops(names.size());
  std::vector<int16_t> name_of(names.size(), -1);
  for (size_t i = 0; i < names.size(); ++i) {
    ops[i] = static_cast<uint32_t>(i);
    const auto it = std::find(names_.begin(), names_.end(), *names[i]);
    if (it != names_.end()) name_of[i] = static_cast<int16_t>(it - names_.begin());
  }
  return match(ops.data(), ops.size(), begin, name_of);
}

}  // namespace opfuse::analyze
