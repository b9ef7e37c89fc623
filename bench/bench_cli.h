// Small pieces every hdk-bench command shares: option parsing, result tables, JSON output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hdk {
namespace bench {

// "--name value" and "--flag" options after the command name.
class Options {
 public:
  Options(int argc, char** argv, int first);

  bool flag(const std::string& name);
  std::string text(const std::string& name, const std::string& fallback);
  int64_t integer(const std::string& name, int64_t fallback);
  double real(const std::string& name, double fallback);
  // "1,2,4" or "1-512" (powers of two) -> list.
  std::vector<int64_t> integers(const std::string& name, const std::vector<int64_t>& fallback);
  std::vector<std::string> texts(const std::string& name, const std::vector<std::string>& fallback);

  // Throws std::runtime_error naming any option no command asked for.
  void reject_unused() const;
  const std::string& command_line() const { return command_line_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
  std::string command_line_;
};

// A table printed as aligned text and saved as JSON records.
class ResultTable {
 public:
  explicit ResultTable(std::vector<std::string> columns);
  void add_row(std::vector<std::string> cells);
  void print() const;
  // [{"column": value, ...}, ...]; numeric-looking cells are written as numbers.
  std::string json_records() const;
  size_t rows() const { return rows_.size(); }
  // Rows whose `column` holds `value`; 0 when there is no such column.
  size_t count(const std::string& column, const std::string& value) const;

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

std::string format(double value, int decimals);
std::string json_escape(const std::string& text);

// Writes {"command": ..., "device": ..., <fields>, <json_fields>, "results": records} to `path`;
// `fields` are scalars (numeric-looking ones written as numbers), `json_fields` JSON as given.
void write_json(const std::string& path, const std::string& command_line,
                const std::map<std::string, std::string>& fields, const std::string& records,
                const std::map<std::string, std::string>& json_fields = {});

// A long run's progress on stderr. On a terminal one line is rewritten in place; in a log (not
// a terminal), where "\r" would run every update into one line, a plain line is written for the
// first update and then at most one every few seconds.
void report_progress(const std::string& text);
// Erases the in-place progress line before the results (nothing to erase in a log).
void clear_progress();

// Median of samples (sorts a copy).
double median(std::vector<double> samples);

using CommandMain = std::function<int(Options&)>;

struct Command {
  const char* name;
  const char* summary;
  CommandMain run;
};

// Defined by each command's file, collected in main.cpp.
int gdn_command(Options& options);
int floor_command(Options& options);
int router_command(Options& options);
int topk_command(Options& options);
int kv_command(Options& options);
int attention_command(Options& options);
int dsv4_step_command(Options& options);

}  // namespace bench
}  // namespace hdk
