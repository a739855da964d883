// The charts' smoothing slider (the run page, compare): a debiased exponential moving average, as TensorBoard's,
// written as a mean that moves toward each new value by the weight it adds. A constant series then stays exactly
// constant; summing and dividing (last / weight) rounded a constant 3e-4 into values a few 1e-20 apart, and Plotly,
// fitting the axis to them, drew a constant learning rate as a saw-tooth.
window.studioSmooth = function (values, smoothing) {
  if (!smoothing) return values;
  const out = new Array(values.length);
  let mean = 0, weight = 0;
  for (let i = 0; i < values.length; i++) {
    weight = weight * smoothing + (1 - smoothing);
    mean += (values[i] - mean) * ((1 - smoothing) / weight);
    out[i] = mean;
  }
  return out;
};
