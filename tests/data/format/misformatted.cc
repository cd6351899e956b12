// The format check's control: laid out against .clang-format on purpose
// (the brace, the spacing and the indent), so the check must name this file.
int   Sum(int a,int b){
      return a+b;}
