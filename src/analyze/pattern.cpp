// Regexes over op names rather than characters: "a-(b|c){0,2}-d" matches the op sequence a, then
// up to two of b or c, then d. Compiled to a small tree and matched by following every way
// through it at once (sets of end positions), so there is no backtracking blow-up and no
// recursion on the input's length, only on the pattern's.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

struct Pattern::Node {
  enum Type { name, sequence, choice } type = name;
  std::string text;                          // type name
  std::vector<std::unique_ptr<Node>> parts;  // sequence / choice
  int min = 1, max = 1;                      // repetitions; max −1: unbounded

  // Every position the node can end at when it starts at one of `starts`.
  std::vector<size_t> ends(const std::vector<const std::string*>& names, std::vector<size_t> starts) const {
    std::vector<size_t> reached = min == 0 ? starts : std::vector<size_t>{};
    for (int rep = 1; !starts.empty() && (max < 0 || rep <= max); ++rep) {
      starts = once(names, starts);
      if (rep >= min) reached.insert(reached.end(), starts.begin(), starts.end());
      if (max < 0 && rep > static_cast<int>(names.size())) break;  // every further round repeats
    }
    std::sort(reached.begin(), reached.end());
    reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
    return reached;
  }

  std::vector<size_t> once(const std::vector<const std::string*>& names, const std::vector<size_t>& starts) const {
    std::vector<size_t> out;
    switch (type) {
      case name:
        for (size_t s : starts)
          if (s < names.size() && *names[s] == text) out.push_back(s + 1);
        break;
      case sequence: {
        out = starts;
        for (const auto& part : parts) out = part->ends(names, out);
        break;
      }
      case choice:
        for (const auto& part : parts) {
          auto e = part->ends(names, starts);
          out.insert(out.end(), e.begin(), e.end());
        }
        break;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // Whether the node can match no names, and the names it can start with.
  bool first_names(std::vector<std::string>& first) const {
    bool empty = true;
    switch (type) {
      case name:
        first.push_back(text);
        empty = false;
        break;
      case sequence:
        for (const auto& part : parts)
          if (!(empty = part->first_names(first))) break;
        break;
      case choice:
        empty = false;
        for (const auto& part : parts) empty = part->first_names(first) || empty;
        break;
    }
    return empty || min == 0;
  }
};

namespace {

bool is_name_char(char c) {
  return c != '(' && c != ')' && c != '|' && c != '-' && c != '{' && c != '}' && c != '?' && c != '*' && c != '+' &&
         c != ' ' && c != '\t';
}

// Recursive descent over: choice = sequence ('|' sequence)*; sequence = piece ('-' piece)*;
// piece = (name | '(' choice ')') quantifier?; quantifier = ? * + {m} {m,} {m,n}.
struct Parser {
  const std::string& s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(fmt::format("pattern '{}': {} at character {}", s, what, i + 1));
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

  std::unique_ptr<Pattern::Node> choice(int depth) {
    if (depth > 32) fail("groups nested too deeply");
    auto first = sequence(depth);
    if (!eat('|')) return first;
    auto node = std::make_unique<Pattern::Node>();
    node->type = Pattern::Node::choice;
    node->parts.push_back(std::move(first));
    do node->parts.push_back(sequence(depth));
    while (eat('|'));
    return node;
  }

  std::unique_ptr<Pattern::Node> sequence(int depth) {
    auto node = std::make_unique<Pattern::Node>();
    node->type = Pattern::Node::sequence;
    do node->parts.push_back(piece(depth));
    while (eat('-'));
    return node;
  }

  std::unique_ptr<Pattern::Node> piece(int depth) {
    std::unique_ptr<Pattern::Node> node;
    skip_space();
    if (eat('(')) {
      node = choice(depth + 1);
      if (!eat(')')) fail("expected ')'");
    } else {
      const size_t start = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      if (i == start) fail("expected an op name");
      node = std::make_unique<Pattern::Node>();
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

  void quantifier(Pattern::Node& node) {
    // A quantified group is wrapped, so "(a-b){0,1}" repeats the whole group.
    int min = 1, max = 1;
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
    node.min = min, node.max = max;
  }
};

}  // namespace

Pattern::Pattern(const std::string& text) : text_(text) {
  Parser p{text_};
  root_ = p.choice(0);
  p.skip_space();
  if (p.i != text_.size()) p.fail("unexpected character");
  nullable_ = root_->first_names(first_);
}
Pattern::~Pattern() = default;
Pattern::Pattern(Pattern&&) noexcept = default;
Pattern& Pattern::operator=(Pattern&&) noexcept = default;

bool Pattern::can_start(const std::string& name) const {
  return nullable_ || std::find(first_.begin(), first_.end(), name) != first_.end();
}

size_t Pattern::match(const std::vector<const std::string*>& names, size_t begin) const {
  if (begin >= names.size()) return 0;
  if (!nullable_ && std::find(first_.begin(), first_.end(), *names[begin]) == first_.end()) return 0;
  const auto ends = root_->ends(names, {begin});
  return ends.empty() ? 0 : ends.back() - begin;
}

}  // namespace opfuse::analyze
