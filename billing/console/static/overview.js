// The Overview's chart: spend per day by model, drawn with the vendored uPlot from the data the
// server put in data-spend (no inline script: the console's CSP is default-src 'self').
(function () {
  "use strict";
  var box = document.getElementById("spend-chart");
  if (!box || !window.uPlot) return;
  var spend = JSON.parse(box.dataset.spend);
  if (!spend.series.length) { box.dataset.points = "0"; return; }
  var colours = ["#1f4e79", "#b5451b", "#2e7d32", "#6a1b9a", "#8d6e00", "#555555"];
  var dashes = [[], [6, 3], [2, 2], [8, 3, 2, 3], [1, 3], [10, 4]];
  // Dollars for people, as billing.console.people.usd writes them: "$104,260.00", "$0.0115"
  // (toLocaleString never writes "1.0426e+5").
  var money = function (v) {
    if (v == null) return "—";
    var a = Math.abs(v);
    var text = a >= 1 || a === 0
      ? a.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })
      : a.toLocaleString("en-US", { maximumSignificantDigits: 3 });
    return (v < 0 ? "\u2212" : "") + "$" + text;
  };
  // The x range: the first day's start to the period's end; the axis and the legend show the
  // days of the zone the page was asked for (spend.tz), not the browser's.
  var first = spend.x[0], last = spend.until;
  var zone = function (ts) { return window.uPlot.tzDate(new Date(ts * 1e3), spend.tz); };
  var series = [{}];
  var data = [spend.x];
  var points = 0;
  spend.series.forEach(function (s, i) {
    series.push({
      label: s.name,
      stroke: colours[i % colours.length],
      dash: dashes[i % dashes.length],
      width: 2,
      points: { show: true, size: 6 },
      spanGaps: false,
      value: function (u, v) { return money(v); }
    });
    // The server sends exact decimal text; a point on a chart is a number.
    var values = s.values.map(function (v) { return v == null ? null : Number(v); });
    data.push(values);
    values.forEach(function (v) { if (v != null) points += 1; });
  });
  var width = function () { return Math.max(320, Math.min(box.clientWidth, 1300)); };
  var chart = new window.uPlot({
    width: width(),
    height: 280,
    tzDate: zone,
    series: series,
    scales: { x: { time: true, range: function () { return [first, last]; } } },
    axes: [{}, { size: 90, values: function (u, ticks) {
      var labels = ticks.map(money);
      box.dataset.yTicks = labels.join("|");  // what the canvas shows, for a reader and tests
      return labels;
    } }]
  }, data, box);
  box.dataset.points = String(points);
  window.addEventListener("resize", function () { chart.setSize({ width: width(), height: 280 }); });
}());
