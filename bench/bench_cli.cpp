#include "bench_cli.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace hdk {
namespace bench {

Options::Options(int argc, char** argv, int first) {
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command_line_ += " ";
    command_line_ += argv[i];
  }
  for (int i = first; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0) throw std::runtime_error("unexpected argument '" + word + "'");
    std::string name = word.substr(2);
    std::string value = "true";
    const size_t equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    }
    values_[name] = value;
    used_[name] = false;
  }
}

bool Options::flag(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) return false;
  used_[name] = true;
  return it->second != "false" && it->second != "0";
}

std::string Options::text(const std::string& name, const std::string& fallback) {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  used_[name] = true;
  return it->second;
}

int64_t Options::integer(const std::string& name, int64_t fallback) {
  const std::string value = text(name, "");
  if (value.empty()) return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (*end != '\0')
    throw std::runtime_error("--" + name + " takes an integer, got '" + value + "'");
  return parsed;
}

double Options::real(const std::string& name, double fallback) {
  const std::string value = text(name, "");
  if (value.empty()) return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value.c_str(), &end);
  if (*end != '\0') throw std::runtime_error("--" + name + " takes a number, got '" + value + "'");
  return parsed;
}

std::vector<std::string> Options::texts(const std::string& name,
                                        const std::vector<std::string>& fallback) {
  const std::string value = text(name, "");
  if (value.empty()) return fallback;
  std::vector<std::string> items;
  std::stringstream stream(value);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::vector<int64_t> Options::integers(const std::string& name,
                                       const std::vector<int64_t>& fallback) {
  const std::vector<std::string> items = texts(name, {});
  if (items.empty()) return fallback;
  std::vector<int64_t> values;
  for (const std::string& item : items) {
    const size_t dash = item.find('-');
    char* end = nullptr;
    if (dash != std::string::npos && dash > 0) {
      const long long low = std::strtoll(item.substr(0, dash).c_str(), &end, 10);
      const long long high = std::strtoll(item.substr(dash + 1).c_str(), &end, 10);
      if (low < 1 || high < low) {
        throw std::runtime_error("--" + name + ": bad range '" + item + "'");
      }
      for (long long v = low; v <= high; v *= 2)
        values.push_back(v);
      continue;
    }
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0') throw std::runtime_error("--" + name + ": '" + item + "' is not an integer");
    values.push_back(v);
  }
  return values;
}

void Options::reject_unused() const {
  for (const auto& [name, used] : used_) {
    if (!used) throw std::runtime_error("unknown option --" + name);
  }
}

ResultTable::ResultTable(std::vector<std::string> columns) : columns_(std::move(columns)) {}

void ResultTable::add_row(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

size_t ResultTable::count(const std::string& column, const std::string& value) const {
  const auto found = std::find(columns_.begin(), columns_.end(), column);
  if (found == columns_.end()) return 0;
  const size_t c = static_cast<size_t>(found - columns_.begin());
  return static_cast<size_t>(
      std::count_if(rows_.begin(), rows_.end(), [&](const auto& row) { return row[c] == value; }));
}

void ResultTable::print() const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].size();
    for (const auto& row : rows_)
      widths[c] = std::max(widths[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      std::printf("%s%*s", c == 0 ? "" : "  ", static_cast<int>(widths[c]), cells[c].c_str());
    }
    std::printf("\n");
  };
  print_row(columns_);
  std::vector<std::string> rule;
  for (size_t width : widths)
    rule.push_back(std::string(width, '-'));
  print_row(rule);
  for (const auto& row : rows_)
    print_row(row);
  std::fflush(stdout);
}

namespace {
bool looks_numeric(const std::string& text) {
  if (text.empty()) return false;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return *end == '\0' && text != "nan" && text != "inf" && text != "-inf";
}
}  // namespace

std::string json_escape(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  return escaped;
}

std::string ResultTable::json_records() const {
  std::string json = "[";
  for (size_t r = 0; r < rows_.size(); ++r) {
    json += r == 0 ? "\n  {" : ",\n  {";
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (c > 0) json += ", ";
      json += "\"" + json_escape(columns_[c]) + "\": ";
      const std::string& cell = rows_[r][c];
      json += looks_numeric(cell) ? cell : "\"" + json_escape(cell) + "\"";
    }
    json += "}";
  }
  return json + "\n]";
}

std::string format(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

void write_json(const std::string& path, const std::string& command_line,
                const std::map<std::string, std::string>& fields, const std::string& records,
                const std::map<std::string, std::string>& json_fields) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot write " + path);
  file << "{\n  \"command\": \"" << json_escape(command_line) << "\"";
  for (const auto& [key, value] : fields) {
    file << ",\n  \"" << json_escape(key)
         << "\": " << (looks_numeric(value) ? value : "\"" + json_escape(value) + "\"");
  }
  for (const auto& [key, json] : json_fields)
    file << ",\n  \"" << json_escape(key) << "\": " << json;
  file << ",\n  \"results\": " << records << "\n}\n";
  std::printf("wrote %s\n", path.c_str());
}

namespace {
bool stderr_is_terminal() {
  static const bool terminal = isatty(fileno(stderr)) != 0;
  return terminal;
}
}  // namespace

void report_progress(const std::string& text) {
  if (stderr_is_terminal()) {
    std::fprintf(stderr, "\r%s ...   ", text.c_str());
    return;
  }
  using Clock = std::chrono::steady_clock;
  static Clock::time_point last_line;
  static bool any_line = false;
  const Clock::time_point now = Clock::now();
  if (any_line && now - last_line < std::chrono::seconds(5)) return;
  std::fprintf(stderr, "%s ...\n", text.c_str());
  last_line = now;
  any_line = true;
}

void clear_progress() {
  if (stderr_is_terminal()) std::fprintf(stderr, "\r%60s\r", "");
}

double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const size_t mid = samples.size() / 2;
  return samples.size() % 2 ? samples[mid] : 0.5 * (samples[mid - 1] + samples[mid]);
}

}  // namespace bench
}  // namespace hdk
